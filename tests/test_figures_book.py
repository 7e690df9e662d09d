"""Figures in the book: published with their files and a cite / rebuild note, checked after a build;
and no result typed by hand into the prose.

Fast: no model is loaded. The notebooks are read as files; ``figures.publish`` runs in this process
on a small matplotlib figure, and the runner's check reads a fake executed notebook made of its
glue outputs.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest

from earlyexit import paths
from earlyexit.book import figures, params, provenance, runner

ROOT = paths.REPO_ROOT
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BOOK_MD = sorted((ROOT / "book").glob("*.md"))


# ------------------------------------------------------------------- static: notebooks as files

FIGURE_DIRECTIVE = re.compile(r"^(?P<fence>`{3,}|:{3,})\{glue:figure\}[ \t]+(?P<key>\S+)[ \t]*\n(?P<body>.*?)^(?P=fence)[ \t]*$",
                              re.M | re.S)


def _cells(path, kind):
    return [(i, c.source) for i, c in enumerate(nbformat.read(path, as_version=4).cells) if c.cell_type == kind]


def _literal(node):
    """A str constant as itself; an f-string as its leading literal text plus '{...}'; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{...}" for v in node.values)
    return None


def publish_calls(path) -> list[dict]:
    """Every ``figures.publish(fig, name, prov, key=...)`` in the code cells of a notebook:
    [{"cell", "name", "key"}], with the name / key as written (None where not a string literal)."""
    out = []
    for i, src in _cells(path, "code"):
        code = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines())
        for node in ast.walk(ast.parse(code)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "publish"):
                continue
            name = _literal(node.args[1]) if len(node.args) > 1 else next(
                (_literal(k.value) for k in node.keywords if k.arg == "name"), None)
            key = next((k.value for k in node.keywords if k.arg == "key"), None)
            out.append({"cell": i, "name": name, "key": name if key is None else _literal(key)})
    return out


def glued_figures(path) -> list[dict]:
    """Every ``{glue:figure} KEY`` directive in the markdown cells: [{"cell", "key", "caption"}]."""
    return [{"cell": i, "key": m["key"], "caption": m["body"]}
            for i, src in _cells(path, "markdown") for m in FIGURE_DIRECTIVE.finditer(src)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_book_figure_is_published_and_cited(path):
    published = {c["key"] for c in publish_calls(path)}
    problems = []
    for g in glued_figures(path):
        if g["key"] not in published:
            problems.append(f"cell {g['cell']}: {{glue:figure}} {g['key']} but no code cell calls "
                            f"figures.publish(fig, NAME, prov, key=\"{g['key']}\")")
        if f"{{glue:text}}`{g['key']}_cite`" not in g["caption"]:
            problems.append(f"cell {g['cell']}: the caption of {g['key']} does not end with the line "
                            f"{{glue:text}}`{g['key']}_cite`")
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


def test_figure_names_are_unique_and_numbered_by_chapter():
    seen: dict[str, str] = {}
    problems = []
    for path in NOTEBOOKS:
        prefix = path.stem[:2] + "_"
        for c in publish_calls(path):
            where = f"{path.name} cell {c['cell']}"
            if c["name"] is None:
                problems.append(f"{where}: the figure name passed to publish must be a string literal")
                continue
            if c["key"] is None:
                problems.append(f"{where}: key= must be a string literal (the {{glue:figure}} refers to it)")
            if not c["name"].startswith(prefix):
                problems.append(f"{where}: figure name {c['name']!r} must start with {prefix!r}")
            if "{...}" in c["name"]:
                continue  # an f-string: only its prefix can be checked here (runner.check_figures sees the rest)
            if c["name"] in seen:
                problems.append(f"{where}: figure name {c['name']!r} is also published by {seen[c['name']]}")
            seen[c["name"]] = where
    assert not problems, "\n".join(problems)
    assert seen, "no notebook publishes a figure"


def test_the_intro_is_an_executed_page():
    assert runner.toc_notebooks()[0] == "00_intro"
    assert not (ROOT / "book" / "intro.md").exists(), "the intro moved to notebooks/00_intro.ipynb"
    assert "00_intro" in params.SCHEMAS
    assert glued_figures(ROOT / "notebooks" / "00_intro.ipynb"), "the intro shows the problem in one figure"


# ----------------------------------------------------------------- executed: publish, then check

@pytest.fixture
def published(tmp_path, monkeypatch):
    """``figures.publish`` on a small figure into tmp/figures; returns (result, glue displays, tmp)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import myst_nb.ext.glue as glue_mod

    shown = []
    monkeypatch.setattr(glue_mod, "ipy_display", lambda obj, raw=False, metadata=None: shown.append((obj, metadata)))
    monkeypatch.setattr(paths, "FIGURES", tmp_path / "figures")
    (tmp_path / "figures").mkdir()
    fig, ax = figures.subplots()
    ax.plot([1, 2, 3], [3, 1, 2], label="a line")
    ax.set(xlabel="generated token t", ylabel="layer")
    ax.legend()
    prov = provenance.collect({"profile": "smoke", "seed": 0}, notebook="zz_fig")
    out = figures.publish(fig, "zz_test", prov, key="fig_test")
    assert not plt.fignum_exists(fig.number), "publish closes the figure"
    return out, shown, tmp_path


def test_publish_writes_three_formats_a_sidecar_and_glues_a_cite_note(published):
    out, shown, tmp = published
    d = tmp / "figures"
    assert sorted(p.name for p in d.iterdir()) == ["zz_test.json", "zz_test.pdf", "zz_test.png", "zz_test.svg"]
    assert out is None, "publish returns nothing, so a cell ending with it prints no file paths into the book"
    assert (d / "zz_test.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"/FontFile2" in (d / "zz_test.pdf").read_bytes(), "PDF fonts must be embedded as TrueType (Type 42)"
    assert "<text" in (d / "zz_test.svg").read_text(), "SVG text must stay <text>"
    side = json.loads((d / "zz_test.json").read_text())
    assert side["rerun"] == "python -m earlyexit book --profile smoke --only zz_fig --rerun"
    assert side["provenance"]["notebook"] == "zz_fig" and side["provenance"]["git_commit"]
    names = {meta["scrapbook"]["name"]: obj for obj, meta in shown}
    assert set(names) == {"fig_test", "fig_test_cite"}
    # (the PNG of the glued figure comes from the kernel's inline backend; outside one, its text/plain)
    assert next(v for k, v in names["fig_test"].items() if k.endswith("text/plain")).startswith("<Figure")
    cite = next(v for k, v in names["fig_test_cite"].items() if k.endswith("text/plain"))
    assert "figures/zz_test.pdf" in cite and "figures/zz_test.json" in cite
    assert "python -m earlyexit book --profile smoke --only zz_fig --rerun" in cite


def _fake_executed(generated: Path, name: str, shown, profile="smoke"):
    """An executed notebook whose one code cell displayed what ``publish`` glued."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("figures.publish(fig, 'zz_test', prov, key='fig_test')")
    cell.outputs = [nbformat.v4.new_output("display_data", data=obj, metadata=meta) for obj, meta in shown]
    nb.cells = [cell]
    nb.metadata["earlyexit"] = {"profile": profile}
    generated.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, generated / f"{name}.ipynb")


def test_check_figures_finds_missing_and_incomplete_files(published, monkeypatch):
    _, shown, tmp = published
    monkeypatch.setattr(paths, "GENERATED", tmp / "generated")
    _fake_executed(tmp / "generated", "zz_fig", shown)
    assert runner.check_figures(["zz_fig", "zz_never_executed"]) == []

    (tmp / "figures" / "zz_test.pdf").unlink()
    problems = runner.check_figures(["zz_fig"])
    assert len(problems) == 1
    assert "zz_fig: figure 'zz_test' has no figures/zz_test.pdf" in problems[0]
    assert "python -m earlyexit book --profile smoke --only zz_fig --rerun" in problems[0]

    side_path = tmp / "figures" / "zz_test.json"
    side = json.loads(side_path.read_text())
    (tmp / "figures" / "zz_test.pdf").write_bytes(b"%PDF")
    side_path.write_text(json.dumps({**side, "rerun": ""}))
    assert "figures/zz_test.json lacks rerun" in " ".join(runner.check_figures(["zz_fig"]))
    side_path.write_text(json.dumps({**side, "provenance": {**side["provenance"], "notebook": "zz_other"}}))
    assert "written by notebook 'zz_other'" in " ".join(runner.check_figures(["zz_fig"]))
    side_path.write_text("{not json")
    assert "not readable JSON" in " ".join(runner.check_figures(["zz_fig"]))


def test_a_book_build_fails_when_a_figure_file_is_missing(published, monkeypatch, capsys):
    """The runner's last step: an up-to-date book whose figure lost its PDF does not pass."""
    _, shown, tmp = published
    for sub in ("notebooks", "profiles"):
        (tmp / sub).mkdir()
    monkeypatch.setattr(paths, "REPO_ROOT", tmp)
    monkeypatch.setattr(paths, "NOTEBOOKS", tmp / "notebooks")
    monkeypatch.setattr(paths, "GENERATED", tmp / "generated")
    monkeypatch.setattr(paths, "PROFILES", tmp / "profiles")
    (tmp / "_toc.yml").write_text("format: jb-book\nroot: book/generated/zz_fig\n")
    (tmp / "profiles" / "t.yml").write_text("description: test\ncommon: {model: tiny-llama}\n")
    nbformat.write(nbformat.v4.new_notebook(), tmp / "notebooks" / "zz_fig.ipynb")
    params.register("zz_fig")
    monkeypatch.setattr(runner, "build_html", lambda strict=True: 0)
    try:
        prof = runner.load_profile("t", notebooks=["zz_fig"])
        _fake_executed(tmp / "generated", "zz_fig", shown, profile="t")
        nb = nbformat.read(tmp / "generated" / "zz_fig.ipynb", as_version=4)
        nb.metadata["earlyexit"] = {"profile": "t", "run_hash": runner.run_hash("zz_fig", dict(prof.parameters("zz_fig")))}
        nbformat.write(nb, tmp / "generated" / "zz_fig.ipynb")
        assert runner.main(["--profile", "t"]) == 0
        (tmp / "figures" / "zz_test.svg").unlink()
        capsys.readouterr()
        assert runner.main(["--profile", "t"]) == 1
        err = capsys.readouterr().err
        assert "error: the figure files of the book are incomplete" in err and "figures/zz_test.svg" in err
    finally:
        params.SCHEMAS.pop("zz_fig", None)


# ------------------------------------------------------ prose: no result numbers typed by hand

# Phrases whose digits are not results: definitions, fixed method settings, names. Matched with any
# whitespace between words. Add to it only what cannot change with a run; a measured number belongs
# in a notebook `note(key, value)` and a {glue:text}`key` role.
ALLOWED_PHRASES = (
    "95% bootstrap interval",   # the level of every interval in the book (metrics.bootstrap_ci)
    "95% interval",
    "column 0",                 # the origin of the provenance maps' x axis
    "batch 1",                  # the timed configuration (one sequence at a time)
    "the 2 counting keys and values",  # the factor 2 of the cache formula
    "Llama 3 family",
    "counted from 0",           # an indexing convention
    "1 − ROUGE-L",              # the loss of a prompt, by definition
    "above 1: ours is faster",  # how to read a speed ratio
)
# Contexts where a number is a reference, not a result: chapter 3, sections 2–4, figure 1, (2023)
ALLOWED_CONTEXTS = (
    r"\b(?:[Cc]hapters?|[Ss]ections?|[Ff]ig(?:ure)?s?\.?|[Tt]ables?|[Pp]arts?|[Pp]anels?|[Ee]q(?:uation)?s?\.?|"
    r"[Aa]ppendix)\s+\d+(?:\s*(?:–|-|,|and|or|to)\s*\d+)*",
    r"(?:et al\.,?\s*|\()(?:19|20)\d\d\b",
)
# A token with letters and digits is a name (SmolLM2-135M-Instruct, Llama-3.2-1B, fp32, bf16, top-1, 4-bit,
# SHA-256, 3D) unless it is a number with a unit (2.5x, 12ms, 3GiB, 40%).
TOKEN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+/-]*")
NUMBER_WITH_UNIT = re.compile(r"^\d[\d,]*(?:\.\d+)?(?:x|×|k|K|M|B|G|ms|s|GiB|MiB|KiB|GB|MB|kB|%)$")
FENCE = re.compile(r"^(?P<fence>`{3,}|:{3,})(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S)
NOT_PROSE_DIRECTIVES = ("{math}", "{code", "{eval-rst}", "{raw}", "{glue:}", "{glue:any}", "{glue:math}")


def _blank(text: str) -> str:
    return re.sub(r"[^\n]", " ", text)


def prose_mask(text: str) -> str:
    """``text`` with everything that is not prose blanked out (same length, so positions still match).

    Goes: code blocks, math ($...$, $$...$$), roles ({glue:text}`k`, {cite}`x`, {numref}`y`), code spans,
    HTML comments, link targets, list markers, and a directive's argument and option lines; the
    content of a directive such as {glue:figure} (its caption) stays, it is prose.
    """
    def fence(m):
        info = m.group("info").strip()
        if info.startswith("{") and not info.startswith(NOT_PROSE_DIRECTIVES):
            body = re.sub(r"^[ \t]*:[\w-]+:.*$", lambda o: _blank(o.group(0)), m.group("body"), flags=re.M)
            head = m.group(0)[: m.start("body") - m.start(0)]
            tail = m.group(0)[m.end("body") - m.start(0):]
            return _blank(head) + prose_mask(body) + _blank(tail)
        return _blank(m.group(0))

    sub = lambda pat, s, flags=0: re.sub(pat, lambda o: _blank(o.group(0)), s, flags=flags)  # noqa: E731
    text = FENCE.sub(fence, text)
    text = sub(r"\$\$.*?\$\$", text, re.S)
    text = sub(r"(?<!\\)\$[^$\n]+?(?<!\\)\$", text)
    text = sub(r"\{[\w:-]+\}`[^`]*`", text)
    text = sub(r"`[^`\n]+`", text)
    text = sub(r"<!--.*?-->", text, re.S)
    text = sub(r"\]\([^)]*\)", text)
    text = sub(r"^[ \t]*(?:\d+[.)]|[-*+])[ \t]", text, re.M)
    text = sub(r"^[ \t]*\(?\w[\w-]*\)?=[ \t]*$", text, re.M)   # MyST targets: (fig-label)=
    return text


def hand_typed_numbers(text: str, allowed=ALLOWED_PHRASES) -> list[str]:
    """The sentences of ``text`` (markdown) with a number in their prose, each once, as written."""
    masked = prose_mask(text)
    for pat in (*ALLOWED_CONTEXTS, *(r"\s+".join(map(re.escape, a.split())) for a in allowed)):
        masked = re.sub(pat, lambda o: _blank(o.group(0)), masked)
    found = []
    for tok in TOKEN.finditer(masked):
        t = tok.group(0).strip(".,/-+")
        if not re.search(r"\d", t) or (re.search(r"[A-Za-z]", t) and not NUMBER_WITH_UNIT.match(t)):
            continue
        s = _sentence(text, tok.start())
        if s not in found:
            found.append(s)
    return found


def _sentence(text: str, pos: int) -> str:
    start = max(text.rfind(". ", 0, pos), text.rfind(".\n", 0, pos), text.rfind("\n\n", 0, pos)) + 1
    ends = [i for i in (text.find(". ", pos), text.find(".\n", pos), text.find("\n\n", pos)) if i >= 0]
    end = min(ends) + 1 if ends else len(text)
    return " ".join(text[start:end].split())


def _prose_sources():
    for p in NOTEBOOKS:
        for i, src in _cells(p, "markdown"):
            yield f"{p.relative_to(ROOT)} cell {i}", src
    for p in BOOK_MD:
        yield str(p.relative_to(ROOT)), p.read_text()


@pytest.mark.parametrize("path", NOTEBOOKS + BOOK_MD, ids=lambda p: p.name)
def test_no_hand_typed_result_numbers_in_prose(path):
    """Digits in prose are results typed by hand (they go stale when a run changes): glue them."""
    sources = ([(f"cell {i}", s) for i, s in _cells(path, "markdown")] if path.suffix == ".ipynb"
               else [("", path.read_text())])
    bad = [f"{where}: {s}" for where, text in sources for s in hand_typed_numbers(text)]
    assert not bad, (f"{path.relative_to(ROOT)} has numbers typed into its prose; glue them from the notebook "
                     f"(note(key, value) and {{glue:text}}`key`), or, if they are not results, add the phrase "
                     f"to ALLOWED_PHRASES in {Path(__file__).name}:\n  " + "\n  ".join(bad))


@pytest.mark.parametrize("text", [
    "ROUGE-L drops to 0.93 with naive-mask.",
    "It is 2.5x faster.",
    "Only 12% of the tokens exit.",
    "Most attention is at layer 17.",
    "```{glue:figure} fig_x\n:name: fig-x\n\nThe mean is 3.4 layers.\n```",
])
def test_lint_flags_numbers_in_prose(text):
    assert hand_typed_numbers(text), text


@pytest.mark.parametrize("text", [
    "The model is SmolLM2-135M-Instruct in fp32 or bf16; top-1 agreement with K/V from a 4-bit GGUF (SHA-256).",
    "It keeps {glue:text}`share:.0%` of the layers, see {numref}`fig-02-scene` and {cite}`schuster2022calm`.",
    "Math $x_1 + 2$ and $$e^{0}$$ and `code 12`.",
    "As in chapter 3 and chapters 2–5, or section 4 (Schuster et al., 2022).",
    "1. first\n2. second\n",
    "```bash\nmake book -j 4\n```",
    "```{glue:figure} fig_x\n:name: fig-02-x\n:width: 80%\n\nMean and 95% bootstrap interval over prompts.\n```",
])
def test_lint_allows_names_references_math_and_code(text):
    assert hand_typed_numbers(text) == []

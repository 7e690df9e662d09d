"""The package's shape: layers over a foundation (store and engine, training, the experiments, the book's build
tooling, the command line), imports that only run downward, no room holding more than a third of the package,
small modules, and an engine that asks its rules and strategies through their interfaces rather than their
classes."""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "earlyexit"
# Lower number = lower layer. A module may import from its own layer or any lower one.
LAYERS = {"foundation": 0, "store": 1, "engine": 1, "training": 2, "experiments": 3, "book": 4, "chapters": 5,
          "cli": 6}
ROOMS = ("store", "engine", "training", "experiments", "book", "chapters", "corpus")
MAX_LINES = 420  # "about 400"


def layer_of(module: str) -> str:
    """'earlyexit.engine.loop' -> 'engine'; the package's own top-level files are the foundation."""
    parts = module.split(".")
    if parts[1:2] and parts[1] in ("store", "engine", "training", "experiments", "book", "chapters"):
        return parts[1]
    if parts[1:2] == ["__main__"]:
        return "cli"
    return "foundation"


def modules():
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        yield name, f


def imports_of(name: str, path: Path):
    """Every earlyexit module ``name`` imports (absolute or relative), with its line."""
    tree = ast.parse(path.read_text())
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("earlyexit"):
                # "from . import points" names a module too
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    yield (sub if (PKG.parent / (sub.replace(".", "/") + ".py")).exists()
                           or (PKG.parent / sub.replace(".", "/")).is_dir() else target), node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("earlyexit"):
                    yield alias.name, node.lineno


def test_imports_only_run_downward():
    wrong = []
    for name, path in modules():
        here = LAYERS[layer_of(name)]
        for target, line in imports_of(name, path):
            if LAYERS[layer_of(target)] > here:
                wrong.append(f"{path.relative_to(PKG)}:{line} ({layer_of(name)}) imports {target} ({layer_of(target)})")
    assert not wrong, "imports that run up a layer:\n" + "\n".join(wrong)


def test_the_layer_check_can_fail(tmp_path):
    """The checker sees an upward import (engine -> book) when there is one."""
    f = tmp_path / "earlyexit" / "engine" / "bad.py"
    f.parent.mkdir(parents=True)
    f.write_text("from ..book import store\nfrom earlyexit.training import loop\n")
    got = [t for t, _ in imports_of("earlyexit.engine.bad", f)]
    assert {layer_of(t) for t in got} == {"book", "training"}


def test_store_and_engine_do_not_import_each_other():
    """Same layer, no ties: the store keeps tables (training's checkpoints use its claims), the engine decodes."""
    ties = [f"{path.relative_to(PKG)}:{line} imports {t}" for name, path in modules()
            for t, line in imports_of(name, path)
            if {layer_of(name), layer_of(t)} == {"store", "engine"}]
    assert not ties, ties


def test_no_room_holds_more_than_a_third_of_the_package():
    lines = {}
    for name, path in modules():
        room = name.split(".")[1] if name.count(".") >= 1 and name.split(".")[1] in ROOMS else "top"
        lines[room] = lines.get(room, 0) + len(path.read_text().splitlines())
    total = sum(lines.values())
    big = {r: n for r, n in lines.items() if n > total / 3}
    assert not big, f"rooms over a third of the package's {total} lines: {big}"


@pytest.mark.parametrize("name, path", list(modules()), ids=lambda x: str(x).rsplit("src/", 1)[-1])
def test_modules_are_small(name, path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{name} has {n} lines; split it by concern (at most about 400)"


def test_engine_never_asks_a_rule_or_strategy_for_its_class():
    for path in (PKG / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                arg = ast.unparse(node.args[0])
                assert not any(w in arg for w in ("rule", "strategy")), f"{path.name}: isinstance({arg}, ...)"
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "hasattr":
                assert "strategy" not in ast.unparse(node.args[0]), f"{path.name}: hasattr on a strategy"


def test_every_strategy_hook_the_loop_calls_is_declared():
    from earlyexit.engine.fill import REGISTRY, Strategy

    hooks = {"reset", "on_exit", "before_layer", "after_layer", "pending", "flush"}
    assert hooks <= set(vars(Strategy)), hooks - set(vars(Strategy))
    for cls in REGISTRY.values():
        assert issubclass(cls, Strategy)


def test_every_rule_answers_plan_checks_and_decide():
    import torch

    from earlyexit.engine.rules import RULES, StepView, make_rule

    kw = {"static": {"layer": 3}, "skipdecode": {"e_max": 6, "e_min": 3}, "scripted": {"exits": (2, 3)},
          "classifier": {"classifier": "some-folder"}}
    for name in RULES:
        r = make_rule(name, 6, **kw.get(name, {}))
        assert list(r.plan(2)) and all(0 <= l < 6 for l in r.plan(2))
        assert isinstance(r.checks_at(3, 1), bool)
        if name == "classifier" or not any(r.checks_at(n, 1) for n in range(1, 6)):
            continue  # never asked (full depth), or decides with a trained classifier: tests/test_classifier.py
        g = torch.Generator().manual_seed(0)
        h = torch.randn(3, 8, generator=g)
        view = StepView(n=3, t=1, n_new=4, h=h, h_prev=h + 0.1 * torch.randn(3, 8, generator=g),
                        logits=torch.randn(3, 11, generator=g), final=torch.tensor([0, 1, 2]))
        out = r.decide(view)
        assert out.dtype == torch.bool and out.shape == (3,), (name, out)


def test_readme_layout_names_every_module():
    """README's layout lists every module of the package in its room's paragraph (a new module that is not
    explained there fails this)."""
    import re

    text = (PKG.parents[1] / "README.md").read_text()
    block = text[text.index("src/earlyexit/      the library"):text.index("tests/              pytest")]
    paragraphs = dict(re.findall(r"^  (\w+)/\s+(.*?)(?=^  \S)", block + "  end", flags=re.S | re.M))
    top = block
    missing = []
    for name, path in modules():
        parts = name.split(".")
        stem = path.stem
        if stem == "__init__":
            continue
        if len(parts) == 2:
            if f"{stem}.py" not in top:
                missing.append(name)
        elif not re.search(rf"\b{stem}\b", paragraphs.get(parts[1], "")):
            missing.append(name)
    assert not missing, f"README's layout does not name: {missing}"


NOTEBOOKS = sorted((PKG.parents[1] / "notebooks").glob("*.ipynb"))
MAX_NOTEBOOK_CODE = 200
# a notebook may import a package's face and these rooms' modules, never an engine or training internal
NOTEBOOK_MAY_IMPORT = ("earlyexit.book", "earlyexit.chapters", "earlyexit.experiments", "earlyexit.engine",
                       "earlyexit.training", "earlyexit.training.checkpoints", "earlyexit.corpus", "earlyexit.paths")


def _code_cells(path):
    import json

    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_chapter_is_narrative_not_logic(path):
    """At most about 200 code lines (parameters included), no private name and no engine or training internal
    imported: what a chapter computes lives in the library, where it is tested."""
    cells = _code_cells(path)
    n = sum(len(c.splitlines()) for c in cells)
    assert n <= MAX_NOTEBOOK_CODE, f"{path.name}: {n} code lines (at most {MAX_NOTEBOOK_CODE}): move logic to src"
    wrong = []
    for src in cells:
        for node in ast.walk(ast.parse("\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith("%")))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("earlyexit"):
                mod = node.module
                names = [a.name for a in node.names]
                inner = [f"{mod}.{n}" for n in names if (PKG.parent / f"{mod}.{n}".replace(".", "/")).with_suffix(".py").exists()]
                if mod not in NOTEBOOK_MAY_IMPORT and not mod.startswith(("earlyexit.book.", "earlyexit.chapters.",
                                                                          "earlyexit.experiments.")):
                    wrong.append(f"from {mod} import {', '.join(names)}")
                elif mod in ("earlyexit.engine", "earlyexit.training") and any(
                        m not in ("earlyexit.training.checkpoints",) for m in inner):
                    wrong.append(f"from {mod} import {', '.join(names)} (an internal module)")
                wrong += [f"{mod}.{n} (private)" for n in names if n.startswith("_")]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if isinstance(node.value, ast.Name) and node.value.id in {
                        "costs", "costmodel", "points", "timing", "probes", "frontier", "compare", "budget",
                        "trained", "classify", "drift", "words", "metrics", "evalset", "chapter", "figures",
                        "plots", "handoff", "store"}:
                    wrong.append(f"{node.value.id}.{node.attr} (private)")
    assert not wrong, f"{path.name} reaches inside the library: {wrong}"


def test_every_dotted_name_in_the_docs_exists():
    """A module path named in a docstring, a comment, README.md or data/README.md (``earlyexit.engine.loop``,
    ``earlyexit.book.runner.main``) names a module or attribute that exists: a moved module leaves no stale path."""
    import importlib
    import re

    root = PKG.parents[1]
    files = [*PKG.rglob("*.py"), root / "README.md", root / "data" / "README.md", *root.glob("benchmarks/*.py")]
    missing = {}
    for f in files:
        for m in re.finditer(r"\bearlyexit(?:\.[A-Za-z_]\w*)+", f.read_text()):
            parts = m.group(0).split(".")
            ok = False
            for i in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:i]))
                except ImportError:
                    continue
                ok = True
                for a in parts[i:]:
                    if not hasattr(obj, a):
                        ok = False
                        break
                    obj = getattr(obj, a)
                break
            if not ok:
                missing.setdefault(m.group(0), f.relative_to(root).as_posix())
    assert not missing, f"stale module paths: {missing}"

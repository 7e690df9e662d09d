"""Numbers a reader can cite, from the web: every figure's files and BibTeX are published with the site,
each caption's cite line links to them, and the repository (when one is known) and the commit of the build
are named by the rerun box, the BibTeX and CITATION.cff; when none is known, nothing names one.

Unit level, no book is built: a one-page Sphinx build with the book's extension (seconds), the bundle's
functions on two real figures, the rerun box. The last test reads the built smoke book, after `make test`
built it (marked `browser`, like the other checks of the built book; it needs no browser itself).
"""
from __future__ import annotations

import json
import re
import subprocess
import zipfile
from io import StringIO
from pathlib import Path

import pytest
import yaml

from earlyexit import paths
from earlyexit.book import bundle, figures, pagecheck, rerun, sphinxext
from helpers import figure_repo

ROOT = paths.REPO_ROOT
FIGS = (("02_scene", "02_naive_collapse"), ("08_pareto", "08_comparison"))
REPO = "https://example.org/earlyexit/book"
SHA = "a" * 40
BUILD_SHA = "b" * 40


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository root (pyproject, CITATION.cff, _config.yml without a repository, no git) with two real
    figures, which paths.REPO_ROOT and paths.FIGURES point at."""
    figure_repo(tmp_path, 'title: x\nrepository:\n  url: ""\n', SHA, FIGS)
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(paths, "FIGURES", tmp_path / "figures")
    return tmp_path


def _set_repository(root: Path, url: str, baseurl: str | None = None) -> None:
    cfg = {"title": "x", "repository": {"url": url}}
    if baseurl:
        cfg["html"] = {"baseurl": baseurl}
    (root / "_config.yml").write_text(yaml.safe_dump(cfg))


# ------------------------------------------------------------------------------ the repository URL

def test_the_repository_url_comes_from_config_else_an_https_origin_else_nowhere(repo):
    assert bundle.repository_url(repo) is None, "no setting, no git: no repository"
    (repo / "_config.yml").unlink()
    assert bundle.repository_url(repo) is None
    git = ["git", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    assert bundle.repository_url(repo) is None, "a checkout without an origin remote"
    subprocess.run(["git", "-C", str(repo), "remote", "add", "origin", "git@example.org:o/r.git"], check=True)
    assert bundle.repository_url(repo) is None, "an ssh remote is no link a reader can follow"
    subprocess.run(["git", "-C", str(repo), "remote", "set-url", "origin",
                    "https://x-access-token:s3cret@example.org/o/r.git"], check=True)
    assert bundle.repository_url(repo) == "https://example.org/o/r", "credentials and .git dropped"
    _set_repository(repo, REPO)
    assert bundle.repository_url(repo) == REPO, "the setting wins over the remote"


# ------------------------------------------------------------------------------------------ BibTeX

def test_bibtex_without_a_url_names_the_commit_and_no_link(repo):
    book = bundle.bibtex_book(repo, git={"commit": BUILD_SHA, "dirty": False})
    assert f"note         = {{Built from commit {BUILD_SHA}.}}" in book
    assert "url" not in book and "http" not in book
    fig = bundle.bibtex_figure("08_pareto", repo / "figures", repo)
    assert f"Made at commit {SHA} with profile smoke." in fig
    assert "url" not in fig and "http" not in fig
    # an unknown commit is left out, not printed as 'unknown'
    assert "note" not in bundle.bibtex_book(repo, git={"commit": "unknown", "dirty": None})


def test_bibtex_with_a_repository_names_it_with_the_commit(repo):
    _set_repository(repo, REPO)
    book = bundle.bibtex_book(repo, git={"commit": BUILD_SHA, "dirty": True})
    assert f"url          = {{{REPO}}}" in book
    assert f"note         = {{Built from commit {BUILD_SHA} (with uncommitted changes) of {REPO}.}}" in book
    fig = bundle.bibtex_figure("08_pareto", repo / "figures", repo)
    assert f"Made at commit {SHA} of {REPO} with profile smoke. Rebuild: python -m earlyexit book" in fig
    assert f"url          = {{{REPO}}}" in fig
    # where the book is published, a figure's entry links to its page
    _set_repository(repo, REPO, baseurl="https://example.org/site/")
    fig = bundle.bibtex_figure("08_pareto", repo / "figures", repo)
    assert "url          = {https://example.org/site/book/generated/08_comparison.html}" in fig
    assert "url          = {https://example.org/site/}" in bundle.bibtex_book(repo)


def test_citation_cff_copies_add_the_repository_and_commit_only_when_known(repo):
    plain = bundle.citation_text(repo, git={"commit": "unknown", "dirty": None})
    assert plain == (repo / "CITATION.cff").read_text()
    stamped = yaml.safe_load(bundle.citation_text(repo, git={"commit": BUILD_SHA, "dirty": False}))
    assert stamped["commit"] == BUILD_SHA and "repository-code" not in stamped and "url" not in stamped
    _set_repository(repo, REPO, baseurl="https://example.org/site/")
    stamped = yaml.safe_load(bundle.citation_text(repo, git={"commit": BUILD_SHA, "dirty": False}))
    assert (stamped["repository-code"], stamped["url"], stamped["commit"]) == (REPO, "https://example.org/site/",
                                                                               BUILD_SHA)
    assert stamped["version"] == "1.2.3", "the rest is the committed file"


# ------------------------------------------------------------------------------- files on the site

def test_publish_site_copies_every_figure_with_the_bundles_bibtex(repo):
    _set_repository(repo, REPO)
    site = repo / "_build" / "html"
    (site / "figures").mkdir(parents=True)
    (site / "figures" / "gone.png").write_bytes(b"stale")
    written = sphinxext.publish_site(site)
    names = sorted(p.relative_to(site).as_posix() for p in written)
    expected = [f"figures/{n}.{e}" for n, _ in FIGS for e in ("bib", "json", "pdf", "png", "svg")]
    assert names == sorted(expected + ["figures/figures.bib", "CITATION.cff"])
    assert not (site / "figures" / "gone.png").exists(), "a figure gone from figures/ is gone from the site"
    for n, _ in FIGS:
        for e in ("json", "pdf", "png", "svg"):
            assert (site / "figures" / f"{n}.{e}").read_bytes() == (repo / "figures" / f"{n}.{e}").read_bytes()
        one = (site / "figures" / f"{n}.bib").read_text()
        assert one == bundle.bibtex_figure(n, repo / "figures", repo)
    # figures.bib holds the same entries as the bundle's
    out, _ = bundle.write_bundle(repo / "b.zip", repo / "figures", root=repo)
    with zipfile.ZipFile(out) as z:
        assert z.read("earlyexit-figures-1.2.3/figures.bib").decode() == (site / "figures" / "figures.bib").read_text()
        assert z.read("earlyexit-figures-1.2.3/CITATION.cff").decode() == (site / "CITATION.cff").read_text()
    keys = re.findall(r"^@misc\{([^,]+),", (site / "figures" / "figures.bib").read_text(), re.M)
    assert keys == ["earlyexit-book", "earlyexit-02_scene", "earlyexit-08_pareto"]
    assert yaml.safe_load((site / "CITATION.cff").read_text())["repository-code"] == REPO


def test_publish_site_refuses_an_incomplete_figure(repo):
    (repo / "figures" / "02_scene.pdf").unlink()
    with pytest.raises(bundle.BundleError, match=r"02_scene: missing 02_scene\.pdf"):
        sphinxext.publish_site(repo / "site")
    assert not (repo / "site").exists(), "nothing written"


# ------------------------------------------------------------------------------ the caption's links

def test_the_cite_note_reads_back_as_its_figure_and_rebuild_command():
    prov = {"notebook": "02_naive_collapse", "profile": "smoke"}
    note = figures.cite_note("02_scene", prov)
    assert sphinxext.parse_cite(note) == ("02_scene",
                                          "python -m earlyexit book --profile smoke --only 02_naive_collapse --rerun")
    assert sphinxext.parse_cite("Files: figures/a.pdf, .svg, .png; provenance and parameters: figures/b.json. "
                                "Rebuild: x") is None, "two names: not one figure's note"
    assert sphinxext.parse_cite("12.5%") is None


def test_cite_links_point_from_the_page_to_the_published_files():
    line = sphinxext.cite_links("02_scene", "python -m earlyexit book --rerun", "book/generated/02_naive_collapse.html")
    refs = [(r.astext(), r["refuri"], r["reftitle"]) for r in line.findall(lambda n: n.tagname == "reference")]
    assert refs == [("PDF", "../../figures/02_scene.pdf", "figures/02_scene.pdf"),
                    ("SVG", "../../figures/02_scene.svg", "figures/02_scene.svg"),
                    ("PNG", "../../figures/02_scene.png", "figures/02_scene.png"),
                    ("data (JSON)", "../../figures/02_scene.json", "figures/02_scene.json"),
                    ("BibTeX", "../../figures/02_scene.bib", "figures/02_scene.bib")]
    assert line.astext() == ("Files (figures/02_scene): PDF \u00b7 SVG \u00b7 PNG \u00b7 data (JSON) \u00b7 BibTeX. "
                             "Rebuild: python -m earlyexit book --rerun")
    assert sphinxext.CITE_CLASS in line["classes"]


def _sphinx_build(src: Path, out: Path, body: str) -> str:
    """Build two reST pages, ``index`` and ``sub/page``, each with ``body`` (where ``:pasted-text:`` makes the
    node myst-nb's ``{glue:text}`` makes), with the book's extension into ``out``; return the warnings."""
    from sphinx.application import Sphinx

    (src / "sub").mkdir(parents=True, exist_ok=True)
    (src / "conf.py").write_text("extensions = ['earlyexit.book.sphinxext']\nsmartquotes_action = 'qe'\n")
    head = ".. role:: pasted-text\n\n"
    (src / "index.rst").write_text(f"Home\n====\n\n{head}{body}\n\n.. toctree::\n\n   sub/page\n")
    (src / "sub" / "page.rst").write_text(f"Page\n====\n\n{head}{body}\n")
    warnings = StringIO()
    app = Sphinx(str(src), str(src), str(out), str(out / ".doctrees"), "html", status=StringIO(),
                 warning=warnings, freshenv=True)
    app.build(force_all=True)
    return warnings.getvalue()


def _page(*notes: str) -> str:
    return "\n\n".join([f"A caption. :pasted-text:`{n}`" for n in notes] + ["Not a note: :pasted-text:`12.5%`"])


def test_a_sphinx_build_links_each_cite_note_and_publishes_the_files(repo):
    from bs4 import BeautifulSoup

    notes = [figures.cite_note(n, {"notebook": nb, "profile": "smoke"}) for n, nb in FIGS]
    out = repo / "_build" / "html"
    warnings = _sphinx_build(repo / "doc", out, _page(*notes))
    assert "WARNING" not in warnings, warnings
    for page in ("index.html", "sub/page.html"):
        html = (out / page).read_text()
        soup = BeautifulSoup(html, "html.parser")
        lines = soup.select(f".{sphinxext.CITE_CLASS}")
        assert len(lines) == 2, page
        for (name, nb), line in zip(FIGS, lines):
            assert [a.get_text() for a in line.select("a")] == ["PDF", "SVG", "PNG", "data (JSON)", "BibTeX"]
            assert line.get_text().endswith(f"Rebuild: python -m earlyexit book --profile smoke --only {nb} --rerun")
            hrefs = [a["href"] for a in line.select("a")]
            assert all(h.endswith(f"figures/{name}.{e}") for h, e in zip(hrefs, ("pdf", "svg", "png", "json", "bib")))
        # the browser check's own link check: every link of the page resolves in the built site
        assert pagecheck.link_problems(out / page, [a["href"] for a in soup.select("a[href]")], out) == []
        assert "Files: figures/" not in soup.get_text(), "no unlinked note left"
        assert "12.5%" in soup.get_text(), "other glued text is left as it was"
    assert (out / "figures" / "figures.bib").exists() and (out / "CITATION.cff").exists()
    assert json.loads((out / "figures" / "08_pareto.json").read_text())["figure"] == "08_pareto"


def test_a_sphinx_build_warns_about_a_caption_whose_figure_is_missing(repo):
    note = figures.cite_note("02_gone", {"notebook": "02_naive_collapse", "profile": "smoke"})
    warnings = _sphinx_build(repo / "doc", repo / "_build" / "html", _page(note))
    assert "figure '02_gone': its caption links to figures/02_gone.png" in warnings
    (repo / "figures" / "08_pareto.svg").unlink()
    warnings = _sphinx_build(repo / "doc", repo / "_build" / "html", _page())
    assert "the figures are not published with the site" in warnings and "08_pareto.svg" in warnings


# ---------------------------------------------------------------------------------- the rerun box

META = {"profile": "smoke", "duration_s": 3, "git_commit": SHA, "git_dirty": False, "parameters": {},
        "executed_utc": "2026-01-15T10:00:00+00:00"}


def test_the_rerun_box_names_the_repository_and_how_to_check_out_the_commit():
    box = rerun.rerun_box("zz", META, REPO)
    assert f"Its source is in the repository [{REPO}]({REPO}), at the commit below:" in box
    assert f"git clone {REPO} earlyexit && cd earlyexit && git checkout {SHA}" in box
    assert box.rstrip().endswith(f"Repository: [{REPO}]({REPO}), commit `{SHA}`.\n:::")
    assert rerun.rerun_box("zz", {**META, "repository": REPO}) == box, "or from the notebook's metadata"
    unknown = rerun.rerun_box("zz", {**META, "git_commit": None}, REPO)
    assert "git clone" not in unknown and f"Its source is in the repository [{REPO}]({REPO})." in unknown


def test_the_rerun_box_without_a_repository_names_none():
    box = rerun.rerun_box("zz", META)
    assert "http" not in box and "git clone" not in box and "Repository" not in box
    assert box.rstrip().endswith(f"Commit: `{SHA}`.\n:::")


def test_add_rerun_box_takes_the_repository_from_the_config(repo):
    import nbformat

    def boxed():
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_markdown_cell("# Title")]
        nb.metadata["earlyexit"] = dict(META)
        rerun.add_rerun_box(nb, "zz")
        return nb.cells[1].source

    assert "http" not in boxed()
    _set_repository(repo, REPO)
    assert f"git clone {REPO} earlyexit" in boxed()


# ----------------------------------------------------------------------------------- the built book

BUILD = ROOT / "_build" / "html"


@pytest.mark.browser
def test_every_caption_of_the_built_book_links_to_its_published_files():
    from bs4 import BeautifulSoup

    if not (BUILD / "index.html").exists():
        pytest.fail("no built book: build it first with `python -m earlyexit book --profile smoke`", pytrace=False)
    problems, seen = [], 0
    for page in pagecheck.pages(BUILD):
        soup = BeautifulSoup((BUILD / page).read_text(), "html.parser")
        if "Files: figures/" in soup.get_text():
            problems.append(f"{page}: a cite note left as plain text")
        for fig in soup.select("figure"):
            lines = fig.select(f".{sphinxext.CITE_CLASS}")
            if not lines and fig.select_one("img"):
                problems.append(f"{page}: a figure without a linked cite line")
            for line in lines:
                seen += 1
                hrefs = [a["href"] for a in line.select("a")]
                if [a.get_text() for a in line.select("a")] != ["PDF", "SVG", "PNG", "data (JSON)", "BibTeX"]:
                    problems.append(f"{page}: cite line {line.get_text()!r}")
                problems += [f"{page}: {p}" for p in pagecheck.link_problems(BUILD / page, hrefs, BUILD)]
    assert seen, "no cite line in the built book"
    bib = (BUILD / "figures" / "figures.bib").read_text()
    assert bib.startswith("@misc{earlyexit-book,")
    assert not problems, "\n".join(problems)

"""Figures ready to cite: the bundle command, its BibTeX, and CITATION.cff following the package version."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from datetime import date

import pytest
import yaml

from earlyexit import paths
from earlyexit.book import bundle, figures, provenance

ROOT = paths.REPO_ROOT


def test_citation_cff_follows_the_package_version():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert str(cff["version"]) == version, \
        f"CITATION.cff version {cff['version']!r} != pyproject.toml version {version!r}: update CITATION.cff " \
        f"(version and date-released) when the package version changes"
    released = date.fromisoformat(str(cff["date-released"]))
    assert released <= date.today()
    assert bundle.citation(ROOT)["version"] == version


@pytest.fixture
def repo(tmp_path):
    """A repository root with pyproject, CITATION.cff, _config.yml and two real figures."""
    import matplotlib

    matplotlib.use("Agg")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "earlyexit"\nversion = "1.2.3"\n')
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    cff.update({"version": "1.2.3", "date-released": "2026-01-15"})
    (tmp_path / "CITATION.cff").write_text(yaml.safe_dump(cff, sort_keys=False))
    (tmp_path / "_config.yml").write_text("title: x\n")
    figs = tmp_path / "figures"
    figs.mkdir()
    for name, nb in (("02_scene", "02_naive_collapse"), ("08_pareto", "08_comparison")):
        fig, ax = figures.subplots()
        ax.plot([0, 1], [1, 0])
        prov = {**provenance.collect({"profile": "smoke"}, notebook=nb), "git_commit": "a" * 40, "git_dirty": False}
        figures.save_figure(fig, name, prov, directory=figs)
    return tmp_path


def test_bundle_holds_every_figure_in_three_formats_with_sidecars_citation_and_bibtex(repo):
    out, names = bundle.write_bundle(repo / "out" / "b.zip", repo / "figures", root=repo)
    with zipfile.ZipFile(out) as z:
        listing = sorted(z.namelist())
        bib = z.read("earlyexit-figures-1.2.3/figures.bib").decode()
        cff = z.read("earlyexit-figures-1.2.3/CITATION.cff").decode()
    top = "earlyexit-figures-1.2.3/"
    expected = [f"{top}{f}" for f in ("CITATION.cff", "README.txt", "figures.bib")]
    expected += [f"{top}figures/{n}.{e}" for n in ("02_scene", "08_pareto") for e in ("json", "pdf", "png", "svg")]
    assert listing == sorted(expected) == sorted(names)
    assert "version: 1.2.3" in cff
    entries = re.findall(r"^@misc\{([^,]+),", bib, re.M)
    assert entries == ["earlyexit-book", "earlyexit-02_scene", "earlyexit-08_pareto"]
    pareto = bib[bib.index("@misc{earlyexit-08_pareto"):]
    assert "title        = {{Early exit vs the KV cache}, figure 08\\_pareto}" in pareto
    assert "version      = {1.2.3}" in pareto and "year         = {2026}" in pareto
    assert f"Made at commit {'a' * 40} with profile smoke. Rebuild: python -m earlyexit book" in pareto
    assert "--only 08\\_comparison --rerun" in pareto
    assert "url" not in pareto, "no URL is known: no url field"
    # the same figures give the same bytes
    again, _ = bundle.write_bundle(repo / "out" / "c.zip", repo / "figures", root=repo)
    assert again.read_bytes() == out.read_bytes()


def test_bibtex_uses_the_books_url_when_known(repo):
    (repo / "_config.yml").write_text("html:\n  baseurl: https://example.org/earlyexit/\n")
    one = bundle.bibtex_figure("08_pareto", repo / "figures", root=repo)
    assert "url          = {https://example.org/earlyexit/book/generated/08_comparison.html}" in one
    book = bundle.bibtex_book(root=repo)
    assert book.startswith("@misc{earlyexit-book,") and "url          = {https://example.org/earlyexit/}" in book
    assert "howpublished = {Online book, version 1.2.3}" in book


def test_bundle_refuses_an_incomplete_figure_and_names_it(repo):
    (repo / "figures" / "02_scene.svg").unlink()
    with pytest.raises(bundle.BundleError, match=r"02_scene: missing 02_scene\.svg"):
        bundle.write_bundle(repo / "b.zip", repo / "figures", root=repo)


def test_bundle_refuses_a_citation_that_lags_the_package(repo):
    (repo / "pyproject.toml").write_text('[project]\nname = "earlyexit"\nversion = "1.3.0"\n')
    with pytest.raises(bundle.BundleError, match=r"version is '1\.2\.3' but pyproject\.toml's .* is '1\.3\.0'"):
        bundle.write_bundle(repo / "b.zip", repo / "figures", root=repo)


def test_unknown_figure_lists_the_valid_ones(repo):
    with pytest.raises(bundle.BundleError, match=r"no figure '08_paretto'.*figures: 02_scene, 08_pareto"):
        bundle.bibtex_figure("08_paretto", repo / "figures", root=repo)


def test_the_command_writes_the_bundle_and_lists_it(repo, tmp_path):
    out = tmp_path / "bundle.zip"
    res = subprocess.run([sys.executable, "-m", "earlyexit", "figures-bundle", "--out", str(out),
                          "--figures", str(repo / "figures")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "figures/08_pareto.pdf" in res.stdout and f"2 figures -> {out}" in res.stdout
    bad = subprocess.run([sys.executable, "-m", "earlyexit", "figures-bundle", "--figures", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "no figures folder" in bad.stderr

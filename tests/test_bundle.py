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
from earlyexit.book import bundle
from helpers import figure_repo

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
    return figure_repo(tmp_path)


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


def test_the_published_measurements_travel_with_the_figures(repo, tmp_path):
    """The dataset chapter 10 compares with is in the zip, with its README, and on the site."""
    import shutil
    import zipfile

    from earlyexit.book import bundle, sphinxext

    shutil.copytree(ROOT / "data" / "published", repo / "data" / "published")
    files = bundle.published_data(repo)
    assert [f.name for f in files] == ["README.md", "self_speculation.csv"]
    out, names = bundle.write_bundle(tmp_path / "b.zip", repo / "figures", repo)
    assert any(n.endswith("data/self_speculation.csv") for n in names)
    with zipfile.ZipFile(out) as z:
        csv = [n for n in z.namelist() if n.endswith("self_speculation.csv")][0]
        assert z.read(csv) == (ROOT / "data" / "published" / "self_speculation.csv").read_bytes()
    site = tmp_path / "site"
    written = sphinxext.publish_site(site, repo / "figures", repo)
    assert (site / "figures" / "self_speculation.csv").exists() and site / "figures" / "README.md" in written

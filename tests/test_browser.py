"""The built book as a reader sees it: every page of _build/html opened in headless Chromium.

Run after a build (`make test` builds the smoke book, then runs `pytest -m browser`). The network is
off for the browser (every request that leaves localhost is aborted), so rendered math proves that
MathJax comes from the build. A screenshot of each page goes to _build/html/_screenshots/.
What is checked on a page: see earlyexit.book.pagecheck. Needs Debian's Chromium (/usr/bin/chromium)
and Playwright for Python (requirements.lock); without them the tests fail and say what to install,
unless EARLYEXIT_NO_BROWSER=1 says to skip them.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from earlyexit import paths
from earlyexit.book import pagecheck, runner

pytestmark = pytest.mark.browser

BUILD = paths.REPO_ROOT / "_build" / "html"
PAGES = pagecheck.pages(BUILD) if BUILD.is_dir() else []
NO_BUILD = "(no built book)"


def opened_checker(root: Path, screenshots: Path | None = None):
    """A started pagecheck.Checker, or the skip / failure that says why there is none."""
    if os.environ.get("EARLYEXIT_NO_BROWSER", "") not in ("", "0"):
        pytest.skip("EARLYEXIT_NO_BROWSER is set: the browser check is skipped")
    try:
        checker = pagecheck.Checker(root, screenshots)
        return checker.__enter__()
    except pagecheck.BrowserMissing as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="module")
def book():
    if not (BUILD / "index.html").exists():
        pytest.fail(f"no built book at {BUILD.relative_to(paths.REPO_ROOT)}: build it first with "
                    f"`python -m earlyexit book --profile smoke` (make test does)", pytrace=False)
    checker = opened_checker(BUILD)
    yield checker
    checker.__exit__(None, None, None)


@pytest.mark.parametrize("page", PAGES or [NO_BUILD], ids=str)
def test_page_as_a_reader_sees_it(book, page):
    report = book.check(page)
    assert not report.problems, f"{page} ({report.title}):\n  - " + "\n  - ".join(report.problems)
    if report.screenshot is not None:
        assert report.screenshot.stat().st_size > 1000


def _chapters():
    return [p for p in PAGES if p.parts[:2] == ("book", "generated")]


@pytest.mark.parametrize("page", _chapters() or [NO_BUILD], ids=str)
def test_chapter_opens_with_its_claim_then_the_rerun_box_and_offers_the_executed_notebook(book, page):
    if page == NO_BUILD:
        pytest.fail("no executed chapter in the built book", pytrace=False)
    from bs4 import BeautifulSoup

    html = BeautifulSoup((BUILD / page).read_text(), "html.parser")
    article = html.select_one("article") or html
    box = article.select_one(f".{runner.RERUN_TAG}")
    assert box is not None, f"{page}: no generated rerun box (class {runner.RERUN_TAG})"
    text = box.get_text()
    name = Path(page).stem
    assert f"--only {name} --rerun" in text and f"papermill notebooks/{name}.ipynb" in text, text
    assert "Built with profile" in text and "at commit" in text, text
    # the box comes after the title and the claim, before the first code cell
    first_para = article.select_one("section p")
    assert first_para is not None and first_para.find_parent(class_=runner.RERUN_TAG) is None
    cells = article.select("div.cell")
    assert cells and box.sourceline < cells[0].sourceline, f"{page}: the rerun box is not before the first cell"
    # the download button offers the executed notebook, with its outputs and run record
    link = html.select_one('a[href$=".ipynb"]')
    assert link is not None, f"{page}: no download link to the notebook"
    nb_path = (BUILD / page).parent / link["href"]
    nb = json.loads(nb_path.read_text())
    assert nb["metadata"]["earlyexit"]["profile"] and nb["metadata"]["earlyexit"]["duration_s"] >= 0
    assert any(c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"), \
        f"{link['href']} has no outputs: the download must be the executed notebook"

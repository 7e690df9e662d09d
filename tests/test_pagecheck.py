"""The browser check's own checks, on small hand-written pages: each defect a reader would see is caught.

The text and link checks are plain functions (run with the unit tests); the page-level checks open
hand-written pages in headless Chromium (marked `browser`: `make test` runs them after the book build).
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from earlyexit.book import pagecheck

# ------------------------------------------------------------------------------------ text checks


@pytest.mark.parametrize("text, expected", [
    ("{'png': PosixPath('/work/main/figures/08_pareto.png')}", "absolute path"),
    ("{'png': PosixPath('figures/08_pareto.png')}", "pathlib repr"),
    ("saved to /home/alice/book/figures/a.png", "absolute path"),
    ("checkpoint in /root/.cache/x", "absolute path"),
    ("written to /tmp/tmpab12/out.ipynb", "absolute path"),
    ("models:  25%|██▌       | 1/4 [03:19<09:58, 199.65s/it]", "progress bar"),
    ("E:   0%|          | 0/2 [00:00<?, ?it/s]", "progress bar"),
    ("LayerSkip: 100%|██████████| 4/4 [00:01<00:00,  3.93step/s, final=13.658]", "progress bar"),
    ("/x/y.py:12: UserWarning: To copy construct from a tensor", "Python warning"),
    ("  warnings.warn(msg)", "Python warning"),
    ("No key 'fig_x' found in glue data for this document. [myst-nb.glue]", "unresolved glue key"),
])
def test_text_problems_flag_what_a_reader_should_not_see(text, expected):
    found = pagecheck.text_problems(text)
    assert any(expected in p for p in found), found


@pytest.mark.parametrize("text", [
    "The cache holds 2 x 30 tensors per token; 25% of the tokens exit early.",
    "See https://example.org/home/page and the file figures/08_pareto.png.",
    "python -m earlyexit book --profile smoke --only 02_naive_collapse --rerun",
    "papermill notebooks/02_naive_collapse.ipynb 02_naive_collapse.out.ipynb -p profile smoke",
    "A warning about the cache, in prose. Speed: 12 tokens/s.",
])
def test_text_problems_leave_ordinary_prose_alone(text):
    assert pagecheck.text_problems(text) == []


def test_text_problems_flag_the_build_directory_itself():
    found = pagecheck.text_problems("loaded from /srv/ci/checkout/data/models", ("/srv/ci/checkout",))
    assert found and "build directory" in found[0]


@pytest.mark.parametrize("text, raw", [
    ("the layer \\(e_s < \\ell\\) is", True),
    ("display \\[K^{\\ell}_{1..t}\\] here", True),
    ("a $e$ exit", True),
    ("$$ x = 1 $$", True),
    ("\\begin{align} x \\end{align}", True),
    ("costs $5 and then $10", False),  # prices, not math: no closing pattern
    ("rendered math leaves no TeX behind", False),
])
def test_raw_math_problems(text, raw):
    assert bool(pagecheck.raw_math_problems(text)) is raw


# ---------------------------------------------------------------------------- tables and figures


@pytest.mark.parametrize("text", [
    "The copies are far from the keys (relative error nan for K, nan for V).",
    "a consistency of NaN at 3.0 layers",
    "speed nan× full depth",
])
def test_prose_nan_is_flagged(text):
    found = pagecheck.prose_nan_problems(text)
    assert found and "NaN in the prose" in found[0], found


@pytest.mark.parametrize("text", [
    "A nanosecond, Nancy's financial nanny, the nan_policy argument and Banana are ordinary words.",
    "The relative error is 0.42 for K and 0.38 for V.",
])
def test_prose_nan_leaves_words_that_contain_it_alone(text):
    assert pagecheck.prose_nan_problems(text) == []


def _table(*cells, head="method | speed"):
    return {"cells": list(cells), "head": head, "w": 300}


@pytest.mark.parametrize("cells, bad", [
    (("method", "speed", "lazy", "NaN"), "'NaN'"),
    (("method", "speed", "lazy", "nan"), "'nan'"),
    (("method", "speed", "lazy", "nan [nan, nan]"), "'nan [nan, nan]'"),
    (("method", "speed", "lazy", "None"), "'None'"),
    (("method", "speed", "lazy", "<NA>"), "'<NA>'"),
    (("method", "speed", "lazy", "NaT"), "'NaT'"),
])
def test_a_missing_value_in_a_table_cell_is_flagged(cells, bad):
    found = pagecheck.table_problems([_table(*cells)], 704)
    assert len(found) == 1 and bad in found[0] and "(method | speed)" in found[0], found


def test_readable_table_cells_pass():
    cells = ("method", "speed (× full depth)", "lazy", "0.93 [0.90, 0.97]", "none reaches the target", "", "n/a",
             "None of the drafts", "nano")
    assert pagecheck.table_problems([_table(*cells)], 704) == []


def test_a_table_wider_than_the_column_is_flagged_and_a_folded_one_passes():
    tables = [{"w": 1210, "head": "layer | 1 | 2 | 3", "cells": []}, {"w": 704, "head": "fits", "cells": []},
              {"w": 0, "head": "folded", "cells": []}]
    found = pagecheck.table_problems(tables, 704)
    assert found == ["a table wider than the page: 1210 px in a 704 px column (layer | 1 | 2 | 3)"]


def test_a_pandas_index_is_flagged_but_not_row_labels():
    index = {"w": 500, "head": "model | cache", "cells": [], "rowheads": ["0", "1", "2"]}
    labels = {"w": 500, "head": "layer", "cells": [], "rowheads": ["1", "2", "3"]}
    plain = {"w": 500, "head": "plain", "cells": [], "rowheads": [None, None]}
    found = pagecheck.table_problems([index, labels, plain], 704)
    assert found == ["a pandas index shown as the first column (0..2): hide it (model | cache)"]


def test_a_coarse_raster_image_is_flagged_but_not_an_svg_or_a_sharp_one():
    images = [{"src": "_images/a.png", "url": "http://h/_images/a.png", "w": 765, "content": True},
              {"src": "_images/b.png", "url": "http://h/_images/b.png", "w": 1600, "content": True},
              {"src": "_images/c.svg", "url": "http://h/_images/c.svg", "w": 326, "content": True},
              {"src": "data:image/svg+xml;base64,AAA", "url": "data:image/svg+xml;base64,AAA", "w": 20, "content": True},
              {"src": "_static/logo.png", "url": "http://h/_static/logo.png", "w": 120, "content": False},
              {"src": "_images/gone.png", "url": "http://h/_images/gone.png", "w": 0, "content": True}]
    found = pagecheck.image_size_problems(images)
    assert found == ["image too coarse for the web: _images/a.png is 765 px wide (at least 1600 px, or an SVG)"]


def test_the_book_shows_its_figures_as_svg_at_the_size_of_its_old_pngs(monkeypatch):
    """What the image check asks of the book: chapter.setup makes every figure a page shows an SVG."""
    import matplotlib

    matplotlib.use("Agg")
    from earlyexit.book import chapter, figures

    fig, ax = figures.subplots()
    ax.plot([0, 1], [0, 1])
    svg = chapter.svg_figure(fig)
    head = svg[svg.index("<svg"):svg.index(">", svg.index("<svg"))]
    width = float(head.split('width="')[1].split("px")[0])
    assert "<text" in svg or "<use" in svg
    assert abs(width - fig.bbox_inches.width * fig.dpi) < 0.15 * fig.bbox_inches.width * fig.dpi   # tight bbox
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: None)   # another test may have left a shell behind
    assert chapter.inline_svg() is False          # outside a notebook kernel there is nothing to configure


# ------------------------------------------------------------------------------------ link checks


def test_link_problems_resolve_files_and_anchors(tmp_path):
    (tmp_path / "a").mkdir()
    page = tmp_path / "a" / "p.html"
    page.write_text('<h1 id="top">x</h1>')
    (tmp_path / "q.html").write_text('<section id="sec-1"><a name="old"></a></section>')
    hrefs = ["../q.html#sec-1", "../q.html#old", "#top", "../q.html", "https://example.org/x",
             "mailto:a@b.c", "../missing.html", "../q.html#nope", "#gone", "../../outside.html"]
    found = pagecheck.link_problems(page, hrefs, tmp_path)
    assert found == ["broken link '../missing.html': missing.html does not exist",
                     "broken anchor '../q.html#nope': no id 'nope' on q.html",
                     "broken anchor '#gone': no id 'gone' on a/p.html",
                     "link '../../outside.html' points outside the book"]


def test_pages_leave_out_assets_and_find_the_redirect(tmp_path):
    for f in ("index.html", "book/generated/01.html", "_static/x.html", "_sources/y.html", "search.html"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("<p>x</p>")
    (tmp_path / "index.html").write_text('<meta http-equiv="Refresh" content="0; url=book/generated/01.html" />')
    assert [str(p) for p in pagecheck.pages(tmp_path)] == ["book/generated/01.html", "index.html", "search.html"]
    assert pagecheck.redirect_target(tmp_path / "index.html") == "book/generated/01.html"
    assert pagecheck.redirect_target(tmp_path / "search.html") is None


def test_a_missing_chromium_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("EARLYEXIT_CHROMIUM", str(tmp_path / "no-such-chromium"))
    with pytest.raises(pagecheck.BrowserMissing, match=r"apt-get install -y chromium.*EARLYEXIT_NO_BROWSER=1"):
        pagecheck.find_chromium()


# ------------------------------------------------------------------------- pages in a real browser

MATHJAX = '<script defer src="_static/mathjax/tex-chtml.js"></script>'
CDN_MATHJAX = '<script defer src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"></script>'
MATH = '<p>The exit layer <span class="math notranslate nohighlight">\\(e_s &lt; \\ell\\)</span> and</p>' \
       '<div class="math notranslate nohighlight">\\[K^{\\ell}_{1..t}\\]</div>'


def _page(body: str, head: str = "") -> str:
    return f"<!doctype html><html><head><meta charset='utf-8'><title>t</title>{head}</head>" \
           f"<body><main><article>{body}</article></main></body></html>"


NUMBERS = "".join(f"<td>{0.123456789 * i:.9f}</td>" for i in range(40))
WIDE_TABLE = f"<table><thead><tr>{''.join(f'<th>layer {i}</th>' for i in range(40))}</tr></thead>" \
             f"<tbody><tr>{NUMBERS}</tr></tbody></table>"
NARROW_TABLE = ("<table><thead><tr><th>method</th><th>speed (× full depth)</th><th>note</th></tr></thead><tbody>"
                "<tr><td>lazy recompute</td><td>0.93 [0.90, 0.97]</td><td></td></tr>"
                "<tr><td>static exit</td><td>n/a</td><td>never exits</td></tr></tbody></table>")


def _output(html: str) -> str:
    """``html`` as a notebook cell's output (a horizontally scrolling box, as myst-nb writes it)."""
    return f"<div class='cell_output'><div class='output text_html' style='overflow-x:auto'>{html}</div></div>"


def _cells_table(value: str) -> str:
    return _output(f"<table><tr><th>method</th><th>speed</th></tr><tr><td>lazy</td><td>{value}</td></tr></table>")


GOOD = _page(MATH + '<img src="_images/fig.png" alt="a figure"><img src="_images/fig.svg" alt="a vector figure">'
             '<p>See <a href="other.html#results">the results</a> and <a href="#top">the top</a>.</p>'
             + _output(NARROW_TABLE)
             + f"<details><summary>all layers</summary>{_output(WIDE_TABLE)}</details>"
             '<div class="cell_input"><pre>x = float("nan")  # code may say nan</pre></div>'
             '<div class="cell_input"><pre>open("/tmp/scratch.txt")  # code may name paths</pre></div>'
             '<div class="highlight-bash"><pre>papermill in.ipynb /tmp/out.ipynb  # a typed command</pre></div>'
             '<h2 id="top">t</h2>', MATHJAX)

BROKEN = {  # page: (html, what the check must report)
    "missing_image.html": (_page('<img src="_images/removed.png">'), "image not loaded: _images/removed.png"),
    "printed_path.html": (_page("<div class='cell_output'><pre>{'png': PosixPath('/work/main/figures/"
                                "08_pareto.png')}</pre></div>"), "absolute path of the build machine"),
    "output_path.html": (_page("<div class='cell_output'><div class='output stream highlight-myst-ansi'><pre>"
                               "saved /home/ci/figures/a.png</pre></div></div>"), "absolute path of the build machine"),
    "progress_bar.html": (_page("<pre>models:  25%|██▌       | 1/4 [03:19&lt;09:58, 199.65s/it]</pre>"),
                          "a tqdm progress bar"),
    "python_warning.html": (_page("<pre>/x/model.py:3: UserWarning: TypedStorage is deprecated</pre>"),
                            "a Python warning"),
    "no_mathjax.html": (_page(MATH), "formulas but MathJax did not load"),
    "cdn_mathjax.html": (_page(MATH, CDN_MATHJAX), "tried to reach the network (blocked): https://cdn.jsdelivr"),
    "bad_tex.html": (_page('<span class="math">\\(x^1^2\\)</span>', MATHJAX), "MathJax errors"),
    "broken_link.html": (_page('<a href="missing.html">x</a>'), "broken link 'missing.html'"),
    "broken_anchor.html": (_page('<a href="other.html#nope">x</a>'), "no id 'nope' on other.html"),
    "js_error.html": (_page("<script>null.boom()</script>"), "uncaught JavaScript error"),
    "glue_key.html": (_page('<div class="system-message"><p>No key \'fig_x\' found in glue data for this '
                            'document. [myst-nb.glue]</p></div>'), "build warning left in the page"),
    "missing_css.html": (_page("<p>x</p>", '<link rel="stylesheet" href="_static/gone.css">'),
                         "_static/gone.css answered HTTP 404"),
    "coarse_image.html": (_page('<img src="_images/coarse.png">'),
                          "image too coarse for the web: _images/coarse.png is 765 px wide"),
    "wide_table.html": (_page(_output(WIDE_TABLE)), "a table wider than the page"),
    "nan_cell.html": (_page(_cells_table("NaN")), "a missing value printed in a table: 1 cell(s) 'NaN'"),
    "nan_ci_cell.html": (_page(_cells_table("nan [nan, nan]")), "a missing value printed in a table"),
    "none_cell.html": (_page(_cells_table("None")), "a missing value printed in a table: 1 cell(s) 'None'"),
    "na_cell.html": (_page(_cells_table("&lt;NA&gt;")), "a missing value printed in a table: 1 cell(s) '<NA>'"),
    "nan_prose.html": (_page("<p>The copies are off by a relative error of nan for K.</p>"), "NaN in the prose"),
    "nan_caption.html": (_page('<figure><img src="_images/fig.svg"><figcaption><p>Speed nan× full depth.</p>'
                               '</figcaption></figure>'), "NaN in the prose"),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    assert spec and spec.origin, "sphinx-mathjax-offline is not installed (requirements.lock)"
    (root / "_static").mkdir()
    (root / "_static" / "mathjax").symlink_to(Path(spec.origin).parent / "static" / "mathjax")
    (root / "_images").mkdir()
    from PIL import Image

    Image.new("RGB", (pagecheck.MIN_IMAGE_PX, 1200), "steelblue").save(root / "_images" / "fig.png")
    Image.new("RGB", (765, 574), "steelblue").save(root / "_images" / "coarse.png")
    (root / "_images" / "fig.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="326px" height="245px" '
                                              'viewBox="0 0 10 10"><rect width="10" height="10" fill="teal"/></svg>')
    (root / "index.html").write_text('<meta http-equiv="Refresh" content="0; url=good.html" />')
    (root / "good.html").write_text(GOOD)
    (root / "other.html").write_text(_page('<h2 id="results">r</h2>'))
    for name, (html, _) in BROKEN.items():
        (root / name).write_text(html)
    return root


@pytest.fixture(scope="module")
def checker(site):
    from test_browser import opened_checker

    c = opened_checker(site, site / "_shots")
    yield c
    c.__exit__(None, None, None)


@pytest.mark.browser
def test_a_good_page_passes_with_math_rendered_offline_and_a_screenshot(checker):
    report = checker.check("good.html")
    assert report.problems == []
    assert report.screenshot.exists() and report.screenshot.read_bytes()[:4] == b"\x89PNG"
    assert checker.check("index.html").problems == []


@pytest.mark.browser
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_page_is_caught(checker, name):
    expected = BROKEN[name][1]
    problems = checker.check(name).problems
    assert any(expected in p for p in problems), f"{name}: expected {expected!r} in {problems}"


@pytest.mark.browser
def test_a_redirect_to_nowhere_is_caught(checker, site):
    (site / "redirect.html").write_text('<meta http-equiv="Refresh" content="0; url=gone.html" />')
    assert checker.check("redirect.html").problems == ["broken link 'gone.html': gone.html does not exist"]


@pytest.mark.browser
def test_no_browser_opt_out_is_explicit(monkeypatch):
    """Without EARLYEXIT_NO_BROWSER, a missing Chromium fails; with it, the check is skipped."""
    from test_browser import opened_checker

    monkeypatch.setenv("EARLYEXIT_CHROMIUM", "/nonexistent/chromium")
    monkeypatch.delenv("EARLYEXIT_NO_BROWSER", raising=False)
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y chromium"):
        opened_checker(Path(os.getcwd()))
    monkeypatch.setenv("EARLYEXIT_NO_BROWSER", "1")
    with pytest.raises(pytest.skip.Exception):
        opened_checker(Path(os.getcwd()))


# ------------------------------------------------------------------ the Sphinx fixes the check found


def test_sphinxext_writes_each_script_once():
    from sphinx.builders.html._assets import _JavaScript

    from earlyexit.book import sphinxext

    thebe = 'const THEBE_JS_URL = "x";'
    ctx = {"script_files": [_JavaScript("_static/a.js"), _JavaScript(None, body=thebe), _JavaScript("_static/a.js"),
                            _JavaScript("", body=thebe), _JavaScript("", body="other")]}
    sphinxext.dedupe_scripts(None, "p", "page.html", ctx, None)
    assert [(js.filename or "", js.attributes.get("body")) for js in ctx["script_files"]] == \
        [("_static/a.js", None), ("", thebe), ("", "other")]


def test_sphinxext_sets_the_theme_mode_unless_configured():
    from types import SimpleNamespace

    from earlyexit.book import sphinxext

    cfg = SimpleNamespace(html_context={})
    sphinxext.default_mode(None, cfg)
    assert cfg.html_context["default_mode"] == "auto"
    cfg = SimpleNamespace(html_context={"default_mode": "light"})
    sphinxext.default_mode(None, cfg)
    assert cfg.html_context["default_mode"] == "light"

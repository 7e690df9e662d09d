"""What a reader sees: open every page of the built book in headless Chromium and check it.

    from earlyexit.book import pagecheck
    with pagecheck.Checker(Path("_build/html")) as c:
        for page in pagecheck.pages(Path("_build/html")):
            print(page, c.check(page))          # a list of problems, [] when the page is fine

The book is served from 127.0.0.1; every request that leaves localhost is aborted, so a page that needs the network
(MathJax from a CDN, a web font) shows it. A page fails on: an ``<img>`` or local file that did not load; math left
as raw TeX or typeset as an error; a glue key or build warning left in the page, an unresolved cross-reference, a
link or ``#anchor`` that does not resolve; a JavaScript error or a request off localhost; the build machine's paths,
a tqdm bar or a Python warning outside code; a table wider than the content column (folded ones pass), or showing a
pandas index; a raster image under :data:`MIN_IMAGE_PX` pixels (SVGs pass); NaN, None, <NA> or NaT in a table cell
or NaN in the prose.

A full-page PNG screenshot of each page goes to ``screenshots/`` (by default
``<build>/_screenshots/``). Chromium is Debian's ``/usr/bin/chromium`` (or ``$EARLYEXIT_CHROMIUM``),
driven by Playwright for Python through ``executable_path``: Playwright never downloads a browser.
"""
from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--no-first-run", "--disable-sync"]
LOCAL_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}
SKIP_DIRS = {"_static", "_sources", "_images", "_screenshots", "_downloads"}
VIEWPORT = {"width": 1280, "height": 900}
MIN_IMAGE_PX = 1600   # the narrowest raster image (natural pixels) a page may show; SVGs are exempt

INSTALL_HINT = ("install Debian's Chromium as root with `apt-get update && apt-get install -y chromium` "
                "(or point EARLYEXIT_CHROMIUM at a Chromium binary) and Playwright for Python with "
                "`make setup` (it is pinned in requirements.lock); to skip the browser check on purpose, "
                "set EARLYEXIT_NO_BROWSER=1")


class BrowserMissing(RuntimeError):
    """Chromium or Playwright is not installed: the message says what to install."""


# ------------------------------------------------------------------------------- text patterns

# Absolute paths of a build machine: a path under one of these roots, not part of a URL or a word.
PATH_ROOTS = ("work", "root", "home", "tmp", "Users", "mnt", "opt", "private/var", "var/folders")
_PATH = re.compile(r"(?<![\w.~:/\-])/(?:" + "|".join(re.escape(r) for r in PATH_ROOTS) + r")/[\w.\-]")
LEAKS = [
    ("an absolute path of the build machine", _PATH),
    ("a pathlib repr (PosixPath/WindowsPath)", re.compile(r"\b(?:Posix|Windows)Path\(")),
    ("a Windows user path", re.compile(r"\b[A-Z]:\\\\?Users\\")),
    ("a tqdm progress bar", re.compile(r"\d%\|")),
    ("a tqdm progress bar", re.compile(r"\b(?:it|step|cell|B)/s[\],]|\ds/it\]")),
    ("a Python warning", re.compile(r"\b[A-Z][A-Za-z]*Warning: ")),
    ("a Python warning", re.compile(r"\bwarnings\.warn\(")),
]
RAW_MATH = [
    ("raw inline math \\( ... \\)", re.compile(r"\\\(.+?\\\)", re.S)),
    ("raw display math \\[ ... \\]", re.compile(r"\\\[.+?\\\]", re.S)),
    ("raw display math $$ ... $$", re.compile(r"\$\$.+?\$\$", re.S)),
    ("raw inline math $ ... $", re.compile(r"(?<![\\$\w])\$(?!\s)[^$\n]{1,200}(?<!\s)\$(?![\w$])")),
    ("a raw \\begin{...} environment", re.compile(r"\\begin\{[a-z*]+\}")),
]
GLUE_LEFTOVERS = re.compile(r"\[myst-?nb\.glue[\w_]*\]|found in glue data|Glue reference .* not found")


def _snippet(text: str, m: re.Match, width: int = 50) -> str:
    a, b = max(0, m.start() - width), min(len(text), m.end() + width)
    return " ".join(text[a:b].split())


def _found(patterns, text: str, fmt: str = "{what}: ...{snip}...", width: int = 50) -> list[str]:
    """One problem per (what, regex) of ``patterns`` found in ``text``, with the text around its first match."""
    return [fmt.format(what=what, snip=_snippet(text, m, width)) for what, rx in patterns if (m := rx.search(text))]


def build_dir_problems(text: str, build_dirs: tuple[str, ...]) -> list[str]:
    """The build's own directories, anywhere in a page (code included)."""
    return [f"the build directory {p!r}: ...{' '.join(text[max(0, i - 40):i + len(p) + 40].split())}..."
            for p in build_dirs if p and (i := text.find(p)) >= 0]


def text_problems(text: str, build_dirs: tuple[str, ...] = ()) -> list[str]:
    """Leaks in a page's text: absolute paths, pathlib reprs, progress bars, Python warnings, glue
    warnings, and the literal ``build_dirs`` (the build's own directory)."""
    return _found(LEAKS, text) + build_dir_problems(text, build_dirs) + \
        _found([("an unresolved glue key", GLUE_LEFTOVERS)], text)


def raw_math_problems(text: str) -> list[str]:
    """TeX that MathJax did not typeset, in text taken outside code blocks."""
    return _found(RAW_MATH, text, "{what} left untypeset: ...{snip}...", 30)


# ------------------------------------------------------------------------------ tables and figures

_NAN = re.compile(r"(?<![A-Za-z0-9_])(?:NaN|nan)(?![A-Za-z0-9_])")   # a missing value as pandas prints it,
MISSING_CELLS = {"None", "<NA>", "NaT"}                            # or as a whole cell
_SVG = re.compile(r"\.svgz?(?:[?#]|$)|^data:image/svg", re.I)


def image_size_problems(images, min_px: int = MIN_IMAGE_PX) -> list[str]:
    """Raster images of the content (dicts: src, url, w: natural width, content) under ``min_px`` wide; SVGs pass."""
    return [f"image too coarse for the web: {i['src']} is {i['w']} px wide (at least {min_px} px, or an SVG)"
            for i in images if i.get("content", True) and 0 < (i.get("w") or 0) < min_px
            and not _SVG.search(i.get("url") or i.get("src") or "")]


def table_problems(tables, column_px: float) -> list[str]:
    """Tables (dicts: w, scroll width, 0 folded; head; cells; rowheads, each body row's header cell or None) wider than
    the column, showing a pandas index (rows 0, 1, 2, ...), or with a NaN/nan, None, <NA> or NaT cell, folded or not."""
    out = [f"a table wider than the page: {t['w']:.0f} px in a {column_px:.0f} px column ({t['head']})"
           for t in tables if t["w"] > column_px + 1]
    for t in tables:
        heads = t.get("rowheads") or []
        if len(heads) >= 2 and heads == [str(i) for i in range(len(heads))]:
            out.append(f"a pandas index shown as the first column (0..{len(heads) - 1}): hide it ({t['head']})")
        bad = [c for c in (" ".join(c.split()) for c in t["cells"]) if c in MISSING_CELLS or _NAN.search(c)]
        if bad:
            out.append(f"a missing value printed in a table: {len(bad)} cell(s) "
                       f"{', '.join(map(repr, dict.fromkeys(bad)))[:120]} ({t['head']})")
    return out


def prose_nan_problems(text: str) -> list[str]:
    """NaN/nan in the prose (outside code and tables): a value never measured, glued as if it were a number."""
    return _found([("NaN in the prose", _NAN)], text)


# ------------------------------------------------------------------------------------------ links

@functools.lru_cache(maxsize=256)
def _ids(path: Path, mtime: float) -> frozenset:
    html = path.read_text(errors="replace")
    return frozenset(unquote(v) for v in re.findall(r"""\s(?:id|name)\s*=\s*["']([^"']+)["']""", html))


def ids_in(path: Path) -> frozenset:
    """Every id (and anchor name) in an HTML file."""
    path = Path(path)
    return _ids(path, path.stat().st_mtime)


def link_problems(page: Path, hrefs, root: Path, page_ids=None) -> list[str]:
    """Internal links of ``page`` (a file under ``root``) whose target file or ``#anchor`` is missing.

    ``hrefs`` are the raw ``href`` values; external links (another scheme or host) are not checked.
    ``page_ids``: the ids of the page as the browser sees it (for ``#anchor`` links to the page
    itself); by default read from the file."""
    root, page = Path(root).resolve(), Path(page).resolve()
    out = []
    for href in dict.fromkeys(hrefs):
        href = (href or "").strip()
        parts = urlsplit(href)
        if not href or href.startswith(("mailto:", "javascript:", "tel:", "data:")) or \
                (parts.scheme and parts.scheme not in ("http", "https", "file")) or \
                (parts.netloc and parts.hostname not in LOCAL_HOSTS):
            continue  # nothing to check, or an external link: not fetched (the browser has no network)
        if parts.scheme == "file" or parts.netloc or parts.path.startswith("/"):
            target = root / unquote(parts.path).lstrip("/")
        elif parts.path:
            target = (page.parent / unquote(parts.path)).resolve()
        else:
            target = page
        if target.is_dir():
            target = target / "index.html"
        if not target.is_relative_to(root):
            out.append(f"link {href!r} points outside the book")
            continue
        if not target.exists():
            out.append(f"broken link {href!r}: {target.relative_to(root)} does not exist")
            continue
        frag = unquote(parts.fragment)
        if frag and target.suffix == ".html":
            ids = page_ids if (target == page and page_ids is not None) else ids_in(target)
            if frag not in ids:
                out.append(f"broken anchor {href!r}: no id {frag!r} on {target.relative_to(root)}")
    return out


# ------------------------------------------------------------------------------------------ pages

def pages(root: Path) -> list[Path]:
    """The HTML pages of a built book (relative to ``root``), leaving out assets and sources."""
    root = Path(root)
    return sorted(p.relative_to(root) for p in root.rglob("*.html")
                  if not (set(p.relative_to(root).parts[:-1]) & SKIP_DIRS))


def redirect_target(path: Path) -> str | None:
    """The URL of a meta-refresh redirect page (jupyter-book's index.html), else None."""
    html = Path(path).read_text(errors="replace")[:2000]
    m = re.search(r"""http-equiv=["']Refresh["'][^>]*content=["'][^"']*url=([^"']+)["']""", html, re.I)
    return m.group(1).strip() if m and len(html) < 1500 else None


def find_chromium() -> str:
    """The Chromium binary: $EARLYEXIT_CHROMIUM, /usr/bin/chromium, or `chromium` on PATH."""
    env = os.environ.get("EARLYEXIT_CHROMIUM")
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise BrowserMissing(f"EARLYEXIT_CHROMIUM={env} is not an executable file; {INSTALL_HINT}")
        return env
    for cand in (CHROMIUM, shutil.which("chromium"), shutil.which("chromium-browser")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    raise BrowserMissing(f"Chromium is missing (no {CHROMIUM}, no `chromium` on PATH): {INSTALL_HINT}")


def require_playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise BrowserMissing(f"Playwright for Python is missing (import failed): {INSTALL_HINT}") from None
    return sync_playwright


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    log_message = lambda self, *args: None  # noqa: E731  (no access log on stderr)

    def end_headers(self):
        self.send_header("Cache-Control", "no-store")
        super().end_headers()


class Server:
    """The book's folder over HTTP on 127.0.0.1 (a free port), in a background thread."""

    def __init__(self, root: Path):
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


# Runs in the page once it has loaded: waits for images and MathJax, then reports what a reader sees.
_INSPECT = r"""
async () => {
  const sleep = (ms) => new Promise(r => setTimeout(r, ms));
  const timeout = (p, ms) => Promise.race([p, sleep(ms)]);
  const imgs = [...document.images];
  imgs.forEach(i => { if (i.loading === 'lazy') i.loading = 'eager'; });
  await timeout(Promise.all(imgs.map(i => i.complete ? null :
      new Promise(r => { i.addEventListener('load', r); i.addEventListener('error', r); }))), 15000);
  const mathNodes = document.querySelectorAll('.math, .MathJax, mjx-container, script[type^="math/tex"]');
  let mathjax = window.MathJax ? 'loaded' : 'absent';
  if (window.MathJax) try {
    if (MathJax.startup && MathJax.startup.promise) { await timeout(MathJax.startup.promise, 20000); }
    if (MathJax.typesetPromise) { await timeout(MathJax.typesetPromise(), 20000); }
    mathjax = 'typeset';
  } catch (e) { mathjax = 'failed: ' + e; }
  const main = document.querySelector('main') || document.body;
  const without = (root, sel) => { const c = root.cloneNode(true); c.querySelectorAll(sel).forEach(e => e.remove()); return c; };
  // visible text outside code: raw TeX must not be here
  const vis = without(main, 'pre, code, script, style, .highlight, mjx-container, .MathJax');
  // the text a reader can reach (folded outputs included), code cells' sources left out
  const full = without(document.body, 'script, style');
  const all = without(document.body, 'script, style, .cell_input, mjx-container, mjx-assistive-mml, .MathJax');
  // code blocks typed in the prose (a command to copy) are the author's; a cell's output is not
  all.querySelectorAll('div[class*="highlight-"]').forEach(e => { if (!e.closest('.cell_output, .output')) e.remove(); });
  const xrefs = [...document.querySelectorAll('.xref, .problematic')].filter(e => !e.closest('a'))
      .map(e => e.textContent.trim()).slice(0, 10);
  const sysmsgs = [...document.querySelectorAll('.system-message')].map(e => e.textContent.trim().slice(0, 200));
  // the content column (the article inside its padding), its tables (0 wide when folded), the prose
  const art = document.querySelector('article') || main, acs = getComputedStyle(art);
  const column = art.clientWidth - parseFloat(acs.paddingLeft || 0) - parseFloat(acs.paddingRight || 0);
  const tables = [...main.querySelectorAll('table')].map(t => ({
    w: t.closest('details:not([open])') || !t.getClientRects().length || (t.checkVisibility && !t.checkVisibility())
       ? 0 : Math.max(t.scrollWidth, t.getBoundingClientRect().width),
    head: [...t.querySelectorAll('th, td')].slice(0, 4).map(c => c.textContent.trim().slice(0, 30)).join(' | '),
    cells: [...t.querySelectorAll('th, td')].map(c => c.textContent.trim()),
    rowheads: [...t.querySelectorAll('tbody tr')].map(r => r.cells[0] && r.cells[0].tagName === 'TH'
                                                           ? r.cells[0].textContent.trim() : null)}));
  const prose = without(main, 'script, style, .cell, table, pre, code, .highlight, mjx-container, .MathJax');
  return {
    images: imgs.map(i => ({src: i.getAttribute('src'), url: i.currentSrc || i.src, w: i.naturalWidth,
                            complete: i.complete, content: main.contains(i)})),
    column, tables, proseText: prose.textContent, mathjax, mathCount: mathNodes.length,
    mathErrors: document.querySelectorAll('mjx-merror, .MathJax_Error').length, mathText: vis.textContent,
    text: all.textContent, fullText: full.textContent,
    hrefs: [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
    ids: [...document.querySelectorAll('[id], a[name]')].map(e => e.id || e.getAttribute('name')),
    xrefs, sysmsgs, title: document.title,
  };
}
"""


@dataclass
class PageReport:
    page: str
    problems: list[str] = field(default_factory=list)
    screenshot: Path | None = None
    title: str = ""


class Checker:
    """Headless Chromium (fresh profile, network blocked outside localhost) over a served book."""

    def __init__(self, root: Path, screenshots: Path | None = None, *, chromium: str | None = None,
                 timeout_ms: int = 60000):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"no built book at {self.root}")
        self.screenshots = Path(screenshots) if screenshots is not None else self.root / "_screenshots"
        self.chromium = chromium or find_chromium()
        self.sync_playwright = require_playwright()
        self.timeout_ms = timeout_ms
        # the build machine's own directory (the checkout the book was built in) must not show in a page
        self.build_dirs = tuple(str(p) for p in (self.root.parent.parent,) if len(str(p)) > 4)

    def __enter__(self):
        self._server = Server(self.root).__enter__()
        self._profile = tempfile.mkdtemp(prefix="earlyexit-chromium-")
        self._pw = self.sync_playwright().start()
        try:
            self._ctx = self._pw.chromium.launch_persistent_context(
                self._profile, executable_path=self.chromium, headless=True, args=LAUNCH_ARGS,
                viewport=VIEWPORT, service_workers="block", accept_downloads=False)
        except Exception as e:
            self._pw.stop()
            self._server.__exit__(None, None, None)
            raise BrowserMissing(f"could not start Chromium ({self.chromium}): {str(e).splitlines()[0]}; "
                                 f"{INSTALL_HINT}") from None
        self.blocked: list[str] = []
        self._ctx.route("**/*", self._route)
        self._ctx.set_default_timeout(self.timeout_ms)
        return self

    def __exit__(self, *exc):
        try:
            self._ctx.close()
        finally:
            self._pw.stop()
            self._server.__exit__(None, None, None)
            shutil.rmtree(self._profile, ignore_errors=True)

    def _route(self, route):
        host = urlsplit(route.request.url).hostname or ""
        if route.request.url.startswith(("data:", "blob:", "about:")) or host in LOCAL_HOSTS:
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort("blockedbyclient")

    def url_of(self, page: Path) -> str:
        return self._server.url + Path(page).as_posix()

    def check(self, page) -> PageReport:
        """Open ``page`` (relative to the book's root) and return what is wrong with it."""
        page = Path(page)
        path = self.root / page
        report = PageReport(str(page))
        problems = report.problems
        target = redirect_target(path)
        if target is not None:  # a redirect page (index.html): its target must exist
            problems += link_problems(path, [target], self.root)
            return report
        errors: list[str] = []
        failed: list[str] = []
        self.blocked.clear()
        tab = self._ctx.new_page()
        tab.on("pageerror", lambda e: errors.append(f"uncaught JavaScript error: {e}"))
        tab.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)

        def on_response(resp):
            if resp.status >= 400 and not resp.url.endswith("/favicon.ico"):
                failed.append(f"{resp.url.replace(self._server.url, '')} answered HTTP {resp.status}")

        tab.on("response", on_response)
        tab.on("requestfailed", lambda r: failed.append(
            f"request failed: {r.url.replace(self._server.url, '')} ({r.failure})")
            if (urlsplit(r.url).hostname or "") in LOCAL_HOSTS else None)
        try:
            tab.goto(self.url_of(page), wait_until="load")
            seen = tab.evaluate(_INSPECT)
            report.title = seen["title"]
            self.screenshots.mkdir(parents=True, exist_ok=True)
            shot = self.screenshots / (page.with_suffix("").as_posix().replace("/", "__") + ".png")
            tab.screenshot(path=str(shot), full_page=True)
            report.screenshot = shot
        finally:
            tab.close()
        problems += [f"image not loaded: {i['src']}" for i in seen["images"] if not i["complete"] or not i["w"]]
        if seen["mathCount"] and seen["mathjax"] == "absent":
            problems.append(f"{seen['mathCount']} formulas but MathJax did not load")
        elif seen["mathjax"].startswith("failed"):
            problems.append(f"MathJax {seen['mathjax']}")
        if seen["mathErrors"]:
            problems.append(f"{seen['mathErrors']} formulas are MathJax errors")
        problems += raw_math_problems(seen["mathText"])
        problems += image_size_problems(seen["images"])
        problems += table_problems(seen["tables"], seen["column"])
        problems += prose_nan_problems(seen["proseText"])
        problems += text_problems(seen["text"])
        problems += [p for p in build_dir_problems(seen["fullText"], self.build_dirs) if p not in problems]
        problems += [f"unresolved cross-reference: {x!r}" for x in seen["xrefs"]]
        problems += [f"build warning left in the page: {m}" for m in seen["sysmsgs"]]
        problems += link_problems(path, seen["hrefs"], self.root, page_ids=set(seen["ids"]))
        problems += [f"tried to reach the network (blocked): {u}" for u in dict.fromkeys(self.blocked)]
        problems += list(dict.fromkeys(failed))
        # a failed or blocked request is also logged as a console error: reported above with its URL
        problems += [e for e in dict.fromkeys(errors) if "Failed to load resource" not in e]
        return report

"""The book's own additions to its HTML: figures a reader can cite, and two fixes found by the browser
check (earlyexit.book.pagecheck).

Loaded by jupyter-book through ``_config.yml``: ``sphinx: extra_extensions: [earlyexit.book.sphinxext]``.

- Every figure is published with the site: at the end of an HTML build, ``<site>/figures/`` gets each
  figure's PDF, SVG, PNG, JSON sidecar and BibTeX entry, plus ``figures.bib`` (the book and every
  figure) and ``<site>/CITATION.cff`` (:func:`publish_site`, with the BibTeX and CITATION.cff of
  :mod:`earlyexit.book.bundle`); a problem is a build warning, so the ``-W`` build fails.
- Each caption's cite line, glued as plain text by ``figures.publish`` and pasted with
  ``{glue:text}`<key>_cite``` (the executed notebook keeps the plain note, which
  ``runner.check_figures`` reads), becomes links to those files (:func:`cite_links`):
  "Files (figures/NAME): PDF · SVG · PNG · data (JSON) · BibTeX. Rebuild: ``command``".
- Every page carried sphinx-thebe's configuration script twice (``const THEBE_JS_URL = ...``), so
  the second copy threw "Identifier 'THEBE_JS_URL' has already been declared" on every page load:
  identical scripts are written once.
- The theme's ``default_mode`` (an ``html_context`` value of pydata-sphinx-theme) was empty, so a
  reader's first page logged "Got invalid theme mode": it is set to ``auto`` (the theme follows the
  reader's system setting, as the empty value ended up doing) unless the configuration sets it.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from docutils import nodes

from .. import paths
from ..files import atomic_write_bytes
from . import bundle
from .figures import FORMATS
from .provenance import git_info

CITE_NOTE = re.compile(r"Files: figures/(?P<name>[^\s/,;]+)\.pdf, \.svg, \.png; provenance and parameters: "
                       r"figures/(?P=name)\.json\. Rebuild: (?P<rerun>\S.*)", re.S)
CITE_CLASS = "earlyexit-cite"  # CSS class of a caption's linked cite line


def parse_cite(text: str) -> tuple[str, str] | None:
    """(figure name, rebuild command) of a cite note written by ``figures.cite_note``; None for other text."""
    m = CITE_NOTE.fullmatch(text.strip())
    return (m["name"], m["rerun"].strip()) if m else None


SITE_FIGURES = "figures"   # <site>/figures/: each figure's files, <name>.bib, and figures.bib


def site_files(name: str) -> dict[str, str]:
    """{label: path relative to the site's root} of what a figure's caption links to, in reading order."""
    return {"PDF": f"{SITE_FIGURES}/{name}.pdf", "SVG": f"{SITE_FIGURES}/{name}.svg",
            "PNG": f"{SITE_FIGURES}/{name}.png", "data (JSON)": f"{SITE_FIGURES}/{name}.json",
            "BibTeX": f"{SITE_FIGURES}/{name}.bib"}


def publish_site(site: Path, directory: Path | None = None, root: Path | None = None,
                 url: str | None = None) -> list[Path]:
    """Put every figure into a built HTML site, ready to cite: ``<site>/figures/<name>.png, .pdf, .svg``
    and ``.json`` (copied from ``directory``, default figures/), ``<name>.bib`` (its entry),
    ``figures.bib`` (the book's entry and every figure's, as in the bundle) and ``<site>/CITATION.cff``
    (:func:`bundle.citation_text`). ``<site>/figures/`` is replaced whole, so a figure that is gone from
    figures/ is gone from the site. Raises bundle.BundleError (nothing written) when a figure is
    incomplete or CITATION.cff does not follow the package version. Returns the files written."""
    site, root = Path(site), Path(root or paths.REPO_ROOT)
    directory = Path(directory or paths.FIGURES)
    sidecars = bundle.figure_sidecars(directory)
    git = git_info(root)
    cff = bundle.citation_text(root, url=url, git=git)
    bib = bundle.bibtex_entries(sidecars, root, url, git=git)
    dest = site / SITE_FIGURES
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    written = []
    for name in sidecars:
        for ext in (*FORMATS, "json"):
            shutil.copyfile(directory / f"{name}.{ext}", dest / f"{name}.{ext}")
            written.append(dest / f"{name}.{ext}")
    for name, entry in zip(sidecars, bib[1:]):
        atomic_write_bytes(dest / f"{name}.bib", entry.encode())
        written.append(dest / f"{name}.bib")
    for f in bundle.published_data(root):                      # the published numbers chapter 10 compares with
        shutil.copyfile(f, dest / f.name)
        written.append(dest / f.name)
    atomic_write_bytes(dest / "figures.bib", "\n".join(bib).encode())
    atomic_write_bytes(site / "CITATION.cff", cff.encode())
    return written + [dest / "figures.bib", site / "CITATION.cff"]


def cite_links(name: str, rerun: str, page_uri: str) -> nodes.inline:
    """The cite line of figure ``name`` as docutils nodes: links, relative to the page at ``page_uri``
    (e.g. ``book/generated/02_naive_collapse.html``), to the files :func:`publish_site` writes,
    then the command that rebuilds the figure."""
    from sphinx.util.osutil import relative_uri

    line = nodes.inline("", "", classes=["pasted-text", CITE_CLASS])
    line += nodes.Text(f"Files ({SITE_FIGURES}/{name}): ")
    for i, (label, target) in enumerate(site_files(name).items()):
        if i:
            line += nodes.Text(" \u00b7 ")
        line += nodes.reference(label, label, refuri=relative_uri(page_uri, target), reftitle=target,
                                internal=True)
    line += nodes.Text(". Rebuild: ")
    line += nodes.literal(rerun, rerun)
    return line


def link_cite_notes(app, doctree, docname) -> None:
    """Turn each glued cite note of an HTML page into :func:`cite_links`; warn (failing the -W build)
    about a figure whose files are not under figures/, or a note that no longer reads as one."""
    if getattr(app.builder, "format", None) != "html":
        return
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    page_uri = app.builder.get_target_uri(docname)
    for node in list(doctree.findall(nodes.inline)):
        if "pasted-text" not in node.get("classes", ()) or CITE_CLASS in node.get("classes", ()):
            continue
        text = node.astext()
        found = parse_cite(text)
        if found is None:
            if text.lstrip().startswith("Files: figures/"):
                logger.warning(f"a figure's cite note does not read as figures.cite_note writes it, so it is "
                               f"not linked: {text[:120]!r}", location=node, type="earlyexit", subtype="cite")
            continue
        name, rerun = found
        missing = [f"figures/{name}.{ext}" for ext in (*FORMATS, "json")
                   if not (paths.FIGURES / f"{name}.{ext}").exists()]
        if missing:
            logger.warning(f"figure {name!r}: its caption links to {', '.join(missing)}, which do not exist "
                           f"(rebuild: {rerun})", location=node, type="earlyexit", subtype="cite")
        node.replace_self(cite_links(name, rerun, page_uri))


def publish_figures(app, exception) -> None:
    """At the end of a successful HTML build, put the figures and their BibTeX into the site."""
    if exception is not None or getattr(app.builder, "format", None) != "html":
        return
    from sphinx.util import logging

    try:
        written = publish_site(Path(app.outdir))
    except bundle.BundleError as e:
        logging.getLogger(__name__).warning(f"the figures are not published with the site: {e}",
                                            type="earlyexit", subtype="figures")
        return
    logging.getLogger(__name__).info(f"published {len(written)} figure and citation files in "
                                     f"{Path(app.outdir).name}/")


def _script_key(js) -> tuple:
    """What makes two scripts the same: the file (an inline script's is None or '') and the attributes
    (an inline script's body is one). Sphinx's own check tells None from '', so the extensions that
    add one script both ways (sphinx-thebe, sphinx-togglebutton) got it twice."""
    attrs = getattr(js, "attributes", None) or {}
    return (str(getattr(js, "filename", js) or ""), tuple(sorted((str(k), str(v)) for k, v in attrs.items())))


def dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    """Drop repeated identical entries (same file or inline body, same attributes) from a page's scripts."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for js in scripts:
        key = _script_key(js)
        if key in seen:
            continue
        seen.add(key)
        kept.append(js)
    context["script_files"] = kept


def default_mode(app, config) -> None:
    context = config.html_context
    if isinstance(context, dict) and not context.get("default_mode"):
        context["default_mode"] = "auto"


def setup(app):
    app.connect("config-inited", default_mode)
    app.connect("doctree-resolved", link_cite_notes)
    app.connect("build-finished", publish_figures)
    app.connect("html-page-context", dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

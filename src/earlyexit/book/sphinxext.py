"""Two fixes to the book's HTML, found by the browser check (earlyexit.book.pagecheck).

Loaded by jupyter-book through ``_config.yml``: ``sphinx: extra_extensions: [earlyexit.book.sphinxext]``.

- Every page carried sphinx-thebe's configuration script twice (``const THEBE_JS_URL = ...``), so
  the second copy threw "Identifier 'THEBE_JS_URL' has already been declared" on every page load:
  identical scripts are written once.
- The theme's ``default_mode`` (an ``html_context`` value of pydata-sphinx-theme) was empty, so a
  reader's first page logged "Got invalid theme mode": it is set to ``auto`` (the theme follows the
  reader's system setting, as the empty value ended up doing) unless the configuration sets it.
"""
from __future__ import annotations


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
    app.connect("html-page-context", dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

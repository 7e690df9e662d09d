"""The generated box that opens every executed chapter: the profile it was built with, its run time and
commit, the repository it comes from (when one is known, :func:`earlyexit.book.bundle.repository_url`), and
the exact commands (``git clone``/``checkout``, ``python -m earlyexit book ... --rerun`` and
``papermill ...``) that rebuild it."""
from __future__ import annotations

import json

from . import params as params_mod
from .provenance import rerun_command


RERUN_TAG = "earlyexit-rerun"  # tag and CSS class of the generated box (tests and the browser check find it)


def _papermill_value(value) -> str:
    """How ``papermill -p`` reads ``value`` back: True/False/None/int/float literals, else a string."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return str(value)


def papermill_command(name: str, parameters: dict, defaults: dict | None = None, width: int | None = None) -> str:
    """The ``papermill`` command that runs ``notebooks/<name>.ipynb`` with ``parameters`` outside the book.

    Only the values that differ from ``defaults`` (the notebook's own, from its schema) are passed, plus
    ``profile``. Scalars go through ``-p`` (papermill turns "3" into 3 and "None" into None), a string
    that papermill would read as something else through ``-r`` (raw), lists and mappings through ``-y``
    (YAML). With ``width``, the command is wrapped into lines of about that many characters, joined by
    the shell's `` \\`` continuation.
    """
    import shlex

    from papermill.cli import _resolve_type

    defaults = dict(defaults or {})
    units = [f"papermill notebooks/{name}.ipynb {name}.out.ipynb"]
    for key, value in parameters.items():
        if key != "profile" and key in defaults and defaults[key] == value \
                and type(defaults[key]) is type(value):
            continue
        if isinstance(value, (list, tuple, dict)):
            units.append("-y " + shlex.quote(json.dumps({key: value})))
        elif isinstance(value, str) and _resolve_type(value) != value:
            units.append(f"-r {key} {shlex.quote(value)}")
        else:
            units.append(f"-p {key} {shlex.quote(_papermill_value(value))}")
    if not width:
        return " ".join(units)
    lines = [units[0]]
    for u in units[1:]:
        if len(lines[-1]) + 1 + len(u) > width:
            lines.append("    " + u)
        else:
            lines[-1] += " " + u
    return " \\\n".join(lines)


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def rerun_box(name: str, meta: dict, repository: str | None = None) -> str:
    """The markdown of the box that opens an executed chapter: how it was made and how to rebuild it.

    ``meta`` is the notebook's ``earlyexit`` metadata (profile, parameters, duration_s, git_commit,
    git_dirty, executed_utc). The title carries the facts (profile, run time, commit); the commands
    are one click away (a dropdown), so the chapter still opens with its claim. ``repository`` (an
    https URL; default ``meta["repository"]``) adds a link to it and the ``git clone``/``checkout`` of the
    commit; without one, the box names no repository.
    """
    repository = repository or meta.get("repository") or None
    profile = meta.get("profile") or "cpu"
    commit = str(meta.get("git_commit") or "unknown")
    short = commit[:12] if commit != "unknown" else commit
    dirty = " (with uncommitted changes)" if meta.get("git_dirty") else ""
    when = str(meta.get("executed_utc", ""))[:10]
    try:
        defaults = dict(params_mod.get(name).defaults())
    except ValueError:
        defaults = {}
    pm_cmd = papermill_command(name, dict(meta.get("parameters") or {}), defaults, width=88)
    book_cmd = rerun_command(name, profile)
    took = _duration(float(meta.get("duration_s") or 0))
    source = []
    if repository:
        source = [f"Its source is in the repository [{repository}]({repository})"
                  + (", at the commit below:" if commit != "unknown" else "."), ""]
        if commit != "unknown":
            source += ["```bash", f"git clone {repository} earlyexit && cd earlyexit && git checkout {commit}",
                       "```", ""]
    last = (f"Repository: [{repository}]({repository}), commit `{commit}`{dirty}." if repository
            else f"Commit: `{commit}`{dirty}.")
    return "\n".join([
        f":::{{admonition}} Built with profile `{profile}` in {took}, at commit `{short}`{dirty}",
        f":class: dropdown note {RERUN_TAG}",
        "",
        f"This page is the notebook `notebooks/{name}.ipynb`, executed on {when} (UTC) with the "
        f"parameters of `profiles/{profile}.yml`. The download button above offers the executed notebook.",
        *source,
        "Rebuild it as part of the book (from the repository root, in its `.venv`):",
        "",
        "```bash",
        book_cmd,
        "```",
        "",
        "or run it alone with papermill (the values that differ from the notebook's defaults):",
        "",
        "```bash",
        pm_cmd,
        "```",
        "",
        last,
        ":::",
    ])


_LOOK_UP = object()


def add_rerun_box(nb, name: str, repository=_LOOK_UP) -> None:
    """Insert :func:`rerun_box` after the notebook's first markdown cell (its title and claim),
    replacing a box inserted before. ``repository``: the URL the box names, by default the book's
    (:func:`earlyexit.book.bundle.repository_url`, None when none is set or found)."""
    import nbformat

    if repository is _LOOK_UP:
        from .bundle import repository_url

        repository = repository_url()
    nb.cells = [c for c in nb.cells if RERUN_TAG not in c.get("metadata", {}).get("tags", [])]
    cell = nbformat.v4.new_markdown_cell(rerun_box(name, nb.metadata.get("earlyexit", {}), repository))
    cell.metadata["tags"] = [RERUN_TAG]
    cell.pop("id", None)
    cell["id"] = f"{RERUN_TAG}-box"
    first_md = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"), -1)
    nb.cells.insert(first_md + 1, cell)


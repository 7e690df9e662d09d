"""One figure style for the whole book, and export with provenance.

    from earlyexit import figures
    figures.setup_style()
    fig, ax = figures.subplots()              # one column wide (3.4 in)
    ...                                       # axis labels with units are the caller's job
    figures.save_figure(fig, "cache_size_vs_length", prov)   # prov from provenance.collect

``save_figure`` writes figures/<name>.png (200 dpi), .pdf and .svg with the fonts kept as text
(TrueType in the PDF, real text in the SVG), plus figures/<name>.json: the provenance record and
the command that rebuilds the figure. Every file is written to a temporary name and renamed, so
an interrupted run never leaves half a figure.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from .. import paths
from ..files import atomic_write as _atomic_write

COLUMN_WIDTH = 3.4  # inches: one column of a two-column paper
FULL_WIDTH = 7.0    # inches: both columns
DPI = 200
FORMATS = ("png", "pdf", "svg")

RC = {
    "figure.figsize": (COLUMN_WIDTH, COLUMN_WIDTH * 0.75),
    "figure.dpi": 110,  # on screen in the notebook
    "savefig.dpi": DPI,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.02,
    "font.size": 8,
    "axes.titlesize": 9,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.title_fontsize": 7,
    "legend.frameon": False,
    "lines.linewidth": 1.4,
    "lines.markersize": 4,
    "axes.linewidth": 0.6,
    "grid.linewidth": 0.4,
    "grid.alpha": 0.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "pdf.fonttype": 42,    # TrueType: text stays text, fonts embedded
    "ps.fonttype": 42,
    "svg.fonttype": "none",  # text as <text>, selectable and searchable
    "svg.hashsalt": "earlyexit",  # stable ids: the same figure gives the same SVG bytes
    "path.simplify": True,
}


def setup_style() -> None:
    """Apply the book's style: seaborn 'ticks' with the colorblind palette and the RC above."""
    import matplotlib
    import seaborn as sns

    sns.set_theme(context="paper", style="ticks", palette="colorblind", rc=RC)
    matplotlib.rcParams.update(RC)


def palette(n: int | None = None):
    import seaborn as sns

    return sns.color_palette("colorblind", n)


def subplots(nrows: int = 1, ncols: int = 1, *, width: float = COLUMN_WIDTH, aspect: float = 0.75, **kw):
    """``plt.subplots`` at the book's sizes: ``width`` inches wide, each panel ``aspect`` tall."""
    import matplotlib.pyplot as plt

    setup_style()
    height = width * aspect * nrows / ncols
    return plt.subplots(nrows, ncols, figsize=(width, height), constrained_layout=True, **kw)


def save_figure(fig, name: str, provenance: Mapping | None = None, *, directory: Path | None = None,
                formats=FORMATS) -> dict:
    """Write ``fig`` as <directory>/<name>.{png,pdf,svg} plus a <name>.json sidecar.

    ``provenance`` is a record from ``earlyexit.book.provenance.collect``; the sidecar adds the figure's
    name, its files and ``rerun``: the command that rebuilds it. Returns {format: path}, with the
    sidecar under "json". ``directory`` defaults to ``earlyexit.paths.FIGURES``.
    """
    from .provenance import rerun_command

    if not name or any(c in name for c in "/\\") or name.startswith("."):
        raise ValueError(f"figure name must be a plain file stem, got {name!r}")
    directory = Path(directory) if directory is not None else paths.FIGURES
    out = {}
    # The PDF would carry the creation date and the SVG a date stamp: drop both so that the same
    # figure gives the same bytes on every run.
    metadata = {"pdf": {"CreationDate": None, "ModDate": None, "Producer": "earlyexit"},
                "svg": {"Date": None}, "png": {"Software": "earlyexit"}}
    for fmt in formats:
        path = directory / f"{name}.{fmt}"
        _atomic_write(path, lambda f, fmt=fmt: fig.savefig(f, format=fmt, dpi=DPI,
                                                           metadata=metadata.get(fmt)))
        out[fmt] = path
    prov = dict(provenance or {})
    sidecar = {
        "figure": name,
        "files": {fmt: p.name for fmt, p in out.items()},
        "rerun": rerun_command(prov.get("notebook"), prov.get("profile")),
        "provenance": prov,
    }
    path = directory / f"{name}.json"
    _atomic_write(path, lambda f: f.write(json.dumps(sidecar, indent=2, sort_keys=True, default=str)
                                          .encode() + b"\n"))
    out["json"] = path
    return out


def cite_note(name: str, provenance: Mapping | None = None) -> str:
    """One line for a caption: where the figure's files are and the command that rebuilds them."""
    from .provenance import rerun_command

    prov = dict(provenance or {})
    return (f"Files: figures/{name}.pdf, .svg, .png; provenance and parameters: figures/{name}.json. "
            f"Rebuild: {rerun_command(prov.get('notebook'), prov.get('profile'))}")


def publish(fig, name: str, provenance: Mapping | None = None, *, key: str | None = None,
            close: bool = True) -> None:
    """Save ``fig`` (see :func:`save_figure`) and glue it for the book.

    Glues the figure under ``key`` (default ``name``) for a ``{glue:figure}`` directive, and the caption's
    cite / rerun line (:func:`cite_note`) as text under ``<key>_cite``. Closes the figure unless ``close``
    is False. Returns nothing, so that a notebook cell ending with it prints nothing (:func:`save_figure` returns
    the files written).
    """
    from myst_nb import glue

    save_figure(fig, name, provenance)
    key = key or name
    glue(key, fig, display=False)
    glue(f"{key}_cite", cite_note(name, provenance), display=False)
    if close:
        import matplotlib.pyplot as plt

        plt.close(fig)

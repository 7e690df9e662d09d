"""What every chapter does before its first experiment, in one call.

    from earlyexit.book import chapter
    C = chapter.setup("02_naive_collapse", globals())
    P, lm, es, note = C.P, C.lm, C.es, C.note

:func:`setup` checks the notebook's parameters (one clear error for a wrong or misspelt one), quiets the
libraries' warnings and progress bars inside the book, sets the torch thread count, the seed and the run-to-run
spread every speed interval adds (:func:`earlyexit.experiments.speeds.set_run_sd`), applies the
figure style, makes the figures a page shows SVG (:func:`inline_svg`), loads the model, builds the evaluation
prompt set (when the chapter has one), collects the provenance record and glues the facts every chapter's prose
may cite (model name, depth, prompt count, ...).
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

from ..alloc import retain_freed_memory
from . import params
from ..experiments.metrics import ci

# How the book names the models it knows; anything else is shown as given.
DISPLAY_NAMES = {"smollm2-135m": "SmolLM2-135M-Instruct"}


def display_name(spec: str) -> str:
    return DISPLAY_NAMES.get(spec, spec)


def model_names(spec: str) -> dict:
    """Display names of chapter 8's models (released, trained, from scratch) for the model ``spec``."""
    name = display_name(spec)
    return {"released": name, "trained": f"{name} + LayerSkip", "distill": f"{name} + self-distillation",
            "scratch-baseline": "from scratch, baseline",
            "scratch-layerskip": "from scratch, LayerSkip"}


def note(key: str, value) -> None:
    """Glue a number or a string for the prose (``{glue:text}`key```) as a plain Python value, not shown."""
    from myst_nb import glue

    glue(key, value.item() if hasattr(value, "item") else value, display=False)


def notes(values: dict) -> None:
    """Glue every value of ``values`` under its key (:func:`note` each): what the chapters' note functions return."""
    for k, v in values.items():
        note(k, v)


@dataclass
class Chapter:
    """What :func:`setup` hands a chapter."""

    P: params.Params
    lm: object = None              # the LoadedModel (None for a chapter that loads none)
    es: object = None              # the evaluation prompt set (None for a chapter without one)
    prov: dict = field(default_factory=dict)
    threads: int = 0
    model_name: str = ""

    note = staticmethod(note)
    notes = staticmethod(notes)
    ci = staticmethod(ci)

    @property
    def L(self) -> int:
        return self.lm.num_layers

    @property
    def min_layer(self) -> int:
        """The lowest layer a confidence rule may exit at: the ``min_layer`` parameter, or half the depth."""
        from ..experiments.points import default_min_layer

        return default_min_layer(self.P.get("min_layer", 0), self.L)


def quiet() -> None:
    """No library warning or progress bar inside a book page (the terminal keeps its own)."""
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm without ipywidgets
    warnings.filterwarnings("ignore", message=".*generation_config.*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


# Raster parts of an inline SVG (an imshow heatmap) are drawn at this resolution; the vectors do not depend on it.
SVG_RASTER_DPI = 300
_SVG_SIZE = re.compile(r'(<svg\b[^>]*?\swidth=")([\d.]+)pt("[^>]*?\sheight=")([\d.]+)pt(")')


def svg_figure(fig) -> str | None:
    """``fig`` as the SVG a page shows: vectors and text (sharp at any zoom, no pixel width to fall short of),
    sized for the page as the book's PNGs were, ``figure.dpi`` CSS pixels an inch (a full-width figure fills the
    column, a column-wide one half of it); None for an empty figure."""
    from IPython.core.pylabtools import print_figure

    svg = print_figure(fig, fmt="svg", dpi=SVG_RASTER_DPI)
    if svg is None:
        return None
    px = fig.dpi / 72  # CSS pixels per point
    return _SVG_SIZE.sub(lambda m: f"{m[1]}{float(m[2]) * px:.1f}px{m[3]}{float(m[4]) * px:.1f}px{m[5]}", svg, 1)


def inline_svg() -> bool:
    """In a notebook kernel, show every figure (glued by :func:`~earlyexit.book.figures.publish`, or left open at
    the end of a cell) as SVG (:func:`svg_figure`) instead of the inline backend's coarse PNG. The exported files
    (figures/<name>.png/pdf/svg) are not affected. Returns whether a kernel was there to configure."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "display_formatter"):
        return False
    import matplotlib.pyplot  # noqa: F401  (loads the inline backend, which sets its formats on load)
    from matplotlib.figure import Figure

    try:  # the inline backend's own setting, so that a later re-activation keeps SVG
        from matplotlib_inline.backend_inline import InlineBackend

        InlineBackend.instance().figure_formats = {"svg"}
    except ImportError:
        pass
    formatters = shell.display_formatter.formatters
    for mime, f in formatters.items():
        if mime != "image/svg+xml":
            f.pop(Figure, None)
    formatters["image/svg+xml"].for_type(Figure, svg_figure)
    return True


def setup(notebook: str, namespace: dict, *, model: bool = True, prompts: bool = True) -> Chapter:
    """Check the parameters in ``namespace`` (the notebook's globals) against ``notebook``'s schema, then do
    the common set-up (see the module docstring). ``model=False`` loads no model, ``prompts=False`` builds no
    prompt set (chapters without one)."""
    import torch

    from ..engine.models import load_model
    from ..engine.threads import set_threads
    from . import figures, provenance
    from ..experiments import speeds
    from ..experiments.evalset import eval_set

    P = params.check(notebook, namespace)
    quiet()
    retain_freed_memory()
    threads = set_threads(P.get("threads", 0))
    speeds.set_run_sd(P.timing_run_sd)
    torch.manual_seed(P.seed)
    figures.setup_style()
    inline_svg()
    C = Chapter(P=P, threads=threads, model_name=display_name(P.model))
    note("model_name", C.model_name)
    note("threads", threads)
    note("threads_phrase", f"{threads} CPU thread" + ("" if threads == 1 else "s"))
    if model:
        C.lm = load_model(P.model, device=P.device, dtype=P.dtype)
        note("L", C.L)
        if "min_layer" in P:
            note("min_layer", C.min_layer)
        if prompts and "n_prompts" in P:
            C.es = eval_set(C.lm, P.prompt_kind, P.n_prompts, P.seed, P.max_prompt_tokens)
            note("n_prompts", len(C.es))
            note("n_new", P.max_new_tokens)
    C.prov = provenance.collect(P, model=C.lm)
    return C

"""What the book's chapters call: experiments, tables, figures, the result cache and the build.

Importing it silences tqdm's "IProgress not found" warning, which a notebook kernel without ipywidgets
prints the first time anything imports ``tqdm.auto``: the book's pages show no warnings, and its progress
bars are off inside notebooks anyway (:mod:`earlyexit.progress`).
"""
import warnings as _warnings

_warnings.filterwarnings("ignore", message="IProgress not found")

# The chapters' parameter schemas register themselves in params.SCHEMAS when book.schemas is imported; importing
# it here (rather than from params, which schemas itself imports) fills the registry before any use, no circle.
from . import schemas as _schemas  # noqa: E402,F401

"""Progress bars for long work in a terminal, never inside a book page.

``EARLYEXIT_PROGRESS=0`` (the book runner sets it for the notebooks' kernels) turns every bar off.
"""
from __future__ import annotations

import os


def enabled() -> bool:
    """Whether progress bars may be shown (``EARLYEXIT_PROGRESS`` is not 0/false/no)."""
    return os.environ.get("EARLYEXIT_PROGRESS", "1").lower() not in ("0", "false", "no")


def bar(iterable=None, *, show: bool = True, **kw):
    """A tqdm bar over ``iterable`` (or with ``total=``), shown only if ``show`` and :func:`enabled`."""
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=not (show and enabled()), **kw)


def say(message: str) -> None:
    """``message`` on stderr, only where progress may be shown (:func:`enabled`): a terminal, not a book page."""
    import sys

    if enabled():
        print(message, file=sys.stderr, flush=True)

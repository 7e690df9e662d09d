"""The competing load of the benchmarks that measure a shared machine: one process spinning on one core."""
from __future__ import annotations

import multiprocessing as mp
import time
from contextlib import contextmanager

CONDITIONS = ("quiet", "one busy process")


def _spin(stop):
    x = 0
    while not stop.is_set():
        x += 1


@contextmanager
def condition(name: str):
    """Run the body under ``name``, one of :data:`CONDITIONS`: as is, or next to one spinning process (started
    half a second before the body, stopped after it)."""
    if name not in CONDITIONS:
        raise ValueError(f"unknown condition {name!r}; valid: {', '.join(CONDITIONS)}")
    if name == "quiet":
        yield
        return
    stop = mp.Event()
    hog = mp.Process(target=_spin, args=(stop,), daemon=True)
    hog.start()
    time.sleep(0.5)
    try:
        yield
    finally:
        stop.set()
        hog.join()

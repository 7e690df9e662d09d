"""The cost model's unit costs on each of the engine's weight paths, timed one after the other.

    units = weightpaths.units_on_paths(lm, ctx=96, shortlist=8192, repeats=5)   # {"float32": ..., "int4": ...}

``"float32"`` is the packed float32 weights the book decodes with; ``"int8"`` and ``"int4"`` are
:class:`~earlyexit.engine.lowbit.LowBitAdapter` (int4: the embedded GGUF's own Q4_1 blocks). All paths are timed
in one cached entry, in the same minute on the machine, so that a comparison between them never sets units timed
now against units timed in another build. Kept apart from the chapter that words the comparison, so that its
wording can change without timing again.
"""
from __future__ import annotations

import pandas as pd

from .. import store
from ..engine.lowbit import LowBitAdapter
from . import costmodel

PATHS = ("float32", "int4")


def units_on_paths(lm, ctx: int, shortlist: int, repeats: int, paths=PATHS) -> dict:
    """{path: unit costs (rows unit, size, seconds, as :func:`~earlyexit.experiments.costmodel.measure_units`)},
    cached per model, paths, sizes, machine and thread count."""
    params = {"ctx": ctx, "shortlist": shortlist, "repeats": repeats, "paths": list(paths), **costmodel.machine_id()}

    def compute():
        return pd.concat([pd.DataFrame(costmodel.time_units(lm if w == "float32" else LowBitAdapter(lm, w), ctx,
                                                            shortlist, repeats)).assign(path=w)
                          for w in paths], ignore_index=True)

    df = store.cached("cost_units_paths", params, compute, model=lm)
    return {w: df[df.path == w].drop(columns="path").reset_index(drop=True) for w in paths}

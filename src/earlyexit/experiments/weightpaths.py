"""The cost model's unit costs on each of the engine's weight paths, timed in turn.

    each = weightpaths.rounds_on_paths(lm, 96, 8192, 5, rounds=5)    # [{"float32": units, "int4": units}, ...]

``"float32"`` is the packed float32 weights the book decodes with; ``"int8"`` and ``"int4"`` are
:class:`~earlyexit.engine.lowbit.LowBitAdapter` (int4: the embedded GGUF's own Q4_1 blocks). All paths are timed
in one cached entry, in turn, for several rounds (the order alternating by round), so that a comparison between
them never sets units timed now against units timed in another build, and a quantity derived from them has a
spread over rounds: two builds of one commit, one round each, put self-speculation's break-even acceptance on the
int4 path at 0.93 and 0.83 (float32: 0.89 and 0.91), and worded the move in opposite directions. Kept apart from
the chapter that words the comparison, so that its wording can change without timing again.
"""
from __future__ import annotations

import pandas as pd

from .. import store
from ..quiet import quiet
from ..engine.lowbit import LowBitAdapter
from . import costmodel

PATHS = ("float32", "int4")


def rounds_on_paths(lm, ctx: int, shortlist: int, repeats: int, rounds: int = 1, paths=PATHS) -> list[dict]:
    """One {path: unit costs (rows unit, size, seconds, as :func:`~earlyexit.experiments.costmodel.measure_units`)}
    per round: each round times every path in turn (in ``paths``' order in even rounds, reversed in odd ones),
    ``repeats`` timings of each unit (their median counts). One cached entry per model, paths, sizes, rounds,
    machine and thread count."""
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds (of the paths timed in turn) must be an int >= 1, got {rounds!r}")
    params = {"ctx": ctx, "shortlist": shortlist, "repeats": repeats, "paths": list(paths), "rounds": rounds,
              **costmodel.machine_id()}

    def compute():
        adapters = {w: lm if w == "float32" else LowBitAdapter(lm, w) for w in paths}
        parts = []
        with quiet("the unit costs on each weight path"):
            for r in range(rounds):
                for w in (paths if r % 2 == 0 else tuple(reversed(paths))):
                    parts.append(pd.DataFrame(costmodel.time_units(adapters[w], ctx, shortlist, repeats))
                                 .assign(path=w, round=r))
        return pd.concat(parts, ignore_index=True)

    df = store.cached("cost_units_paths", params, compute, model=lm)
    return [{w: df[(df.path == w) & (df["round"] == r)].drop(columns=["path", "round"]).reset_index(drop=True)
             for w in paths} for r in range(rounds)]

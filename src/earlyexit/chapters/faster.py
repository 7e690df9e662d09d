"""Chapter 9's last question: do its conclusions hold on a faster engine?

The cost model's units are timed on the engine's float32 weights and, right after, on its int4 weight path
(:mod:`earlyexit.experiments.weightpaths`; the int4 path, :mod:`earlyexit.engine.lowbit`, holds the embedded GGUF's
own Q4_1 blocks, the head at int8, with bf16 products), which reads about a sixth of the float32 bytes.
The chapter's two summary numbers are then recomputed from those units: the acceptance at which self-speculation
breaks even, and the speed oracle exits would reach (the same replayed exits, priced by the new units).

    each = weightpaths.rounds_on_paths(released, P.unit_ctx, P.shortlist, P.unit_repeats, P.path_rounds)
    tab, change = faster.move_rounds(each, L, E, d, sig, P.speed_goal)   # medians; each move's 95% interval
    C.notes(faster.move_notes(tab, change=change))                     # a move worded only where it is measured

Two builds of one commit, one round each, put the int4 path's break-even acceptance at 0.93 and 0.83 and worded
the case for early exit "harder" in one and "about where it was" in the other: a move is worded only where the
change's 95% interval over rounds of paired unit timings excludes 0.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..experiments import budget, frontier, speeds
from .ch09 import exit_needed, unit_costs

ROWS = ("layer, one token [ms]", "head [ms]", "step overhead [ms]", "full-depth step [ms]", "head [layers]",
        "mean exit for the speed goal [layers]", "break-even acceptance", "oracle exits [× full depth]")


def move_table(paths: dict, L: int, E: int, d: int, sig: pd.DataFrame, speed_goal: float) -> pd.DataFrame:
    """One column per weight path (``paths``: name -> units), one row per quantity of :data:`ROWS`: the units,
    a full-depth step (L layers, the head, the overhead), the head in layers, the mean exit that ``speed_goal``
    needs with free decisions, self-speculation's break-even acceptance at (E, d) (NaN: out of reach even with
    every draft accepted) and oracle exits' speed over the replayed continuations ``sig``."""
    cols = {}
    for name, units in paths.items():
        U = unit_costs(units)
        c1, head, over = U[("layer", 1)], U[("head", 1)], U[("step", 1)]
        fr = frontier.frontier(sig, L, units)
        oracle = float(fr[fr.rule == "oracle"]["speed"].iloc[0])
        cols[name] = [c1 * 1e3, head * 1e3, over * 1e3, (L * c1 + head + over) * 1e3, head / c1,
                      exit_needed(U, L, speed_goal)["need_exit"], budget.needed_acceptance(L, E, d, units, 1.0),
                      oracle]
    return pd.DataFrame(cols, index=pd.Index(list(ROWS), name="quantity"))


def move_rounds(rounds: list[dict], L: int, E: int, d: int, sig: pd.DataFrame, speed_goal: float,
                ref: str = "float32", fast: str = "int4") -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`move_table` of each round of paired unit timings (``rounds``, as
    :func:`earlyexit.experiments.weightpaths.rounds_on_paths` gives them): the table of each quantity's median over
    rounds (out of reach counting as the highest), and each quantity's change from ``ref`` to ``fast`` (``change``,
    the mean over rounds) with its 95% t-interval over rounds (``lo``, ``hi``; NaN with one round or where a round
    has it out of reach)."""
    tabs = [move_table(r, L, E, d, sig, speed_goal) for r in rounds]
    stack = np.stack([t.to_numpy(dtype=float) for t in tabs])
    med = np.median(np.where(np.isfinite(stack), stack, np.inf), axis=0)
    tab = pd.DataFrame(np.where(np.isfinite(med), med, np.nan), index=tabs[0].index, columns=tabs[0].columns)
    cols = list(tabs[0].columns)
    diff = stack[:, :, cols.index(fast)] - stack[:, :, cols.index(ref)]
    rows = []
    for x in diff.T:
        m, half = (float(x.mean()), speeds.t_half_width(x)) if np.isfinite(x).all() else (math.nan, math.nan)
        rows.append((m, m - half, m + half))
    return tab, pd.DataFrame(rows, index=tab.index, columns=["change", "lo", "hi"])


def moves(a: float, b: float, digits: int = 2, lo: float = math.nan, hi: float = math.nan) -> str:
    """How a quantity went from ``a`` to ``b``, in words: "rises from a to b", "falls from a to b", "stays at a"
    (equal at ``digits`` decimals); "does not move measurably (a and b)" when the change's 95% interval
    [``lo``, ``hi``] contains 0 (no interval: the values decide); NaN reads as out of reach."""
    fa, fb = (f"{x:.{digits}f}" if math.isfinite(x) else "out of reach" for x in (a, b))
    if fa == fb:
        return f"stays at {fa}"
    if not math.isfinite(a) or not math.isfinite(b):
        return f"goes from {fa} to {fb}"
    if _unmeasured(lo, hi):
        return f"does not move measurably ({fa} and {fb})"
    return f"{'rises' if b > a else 'falls'} from {fa} to {fb}"


def _unmeasured(lo: float, hi: float) -> bool:
    """A change whose 95% interval [lo, hi] contains 0 (False without an interval)."""
    return math.isfinite(lo) and math.isfinite(hi) and lo <= 0.0 <= hi


def move_notes(tab: pd.DataFrame, ref: str = "float32", fast: str = "int4", change: pd.DataFrame | None = None) -> dict:
    """Glue for the section: each path's full-depth step, the speed-up of the fast path's step, and one sentence
    (or clause) for each of the chapter's summary numbers (a move only where ``change``'s interval, from
    :func:`move_rounds`, excludes 0)."""
    r, f = tab[ref], tab[fast]

    def mv(row, digits=2):
        lo, hi = (float(change.loc[row, c]) for c in ("lo", "hi")) if change is not None else (math.nan, math.nan)
        return moves(float(r[row]), float(f[row]), digits, lo, hi)

    return {"fast_step_ms": float(f["full-depth step [ms]"]), "ref_step_ms": float(r["full-depth step [ms]"]),
            "fast_step_ratio": float(r["full-depth step [ms]"] / f["full-depth step [ms]"]),
            "fast_head": f"The head costs {r['head [layers]']:.1f} layers of one token on the {ref} path and "
                         f"{f['head [layers]']:.1f} on the {fast} path, and the step overhead "
                         f"{mv('step overhead [ms]', 1)} ms.",
            "fast_break_even": f"Self-speculation's break-even acceptance {mv('break-even acceptance')}",
            "fast_oracle": f"oracle exits' speed {mv('oracle exits [× full depth]')} times full depth",
            "fast_exit": f"the mean exit the speed goal needs {mv('mean exit for the speed goal [layers]', 1)} layers",
            "fast_verdict": move_verdict(tab, ref, fast, change)}


def move_verdict(tab: pd.DataFrame, ref: str = "float32", fast: str = "int4", change: pd.DataFrame | None = None) -> str:
    """What the faster path does to the case for early exit: harder when self-speculation needs more acceptance
    and oracle exits gain less, easier when the opposite, mixed otherwise (NaN, out of reach, counts as the
    hardest; a change whose interval in ``change`` contains 0, or equal at two decimals, counts as none)."""
    def worse(row, higher_is_worse):
        a, b = (float(tab.loc[row, c]) for c in (ref, fast))
        a, b = (x if math.isfinite(x) else (math.inf if higher_is_worse else -math.inf) for x in (a, b))
        if change is not None and _unmeasured(float(change.loc[row, "lo"]), float(change.loc[row, "hi"])):
            return 0
        return 0 if round(a, 2) == round(b, 2) else (1 if (b > a) == higher_is_worse else -1)
    score = worse("break-even acceptance", True) + worse("oracle exits [× full depth]", False)
    share = "the head and the overhead weigh more beside cheaper layers"
    if score > 0:
        return f"A faster engine makes the case for early exit harder, not easier: {share}."
    if score < 0:
        return "A faster engine makes the case for early exit easier: the layers that an exit saves weigh more."
    return ("A faster engine leaves the case for early exit about where it was: its two bounds move in opposite "
            "directions or not measurably.")

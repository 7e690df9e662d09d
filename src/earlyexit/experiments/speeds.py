"""A speed ratio from paired timings (:mod:`earlyexit.experiments.timing`): the geometric mean over prompts of
each prompt's ratio (its median over rounds), a 95% interval, a verdict ("faster", "slower") only when the
interval excludes 1.0, and the decimals the interval supports. Kept apart from the timing code, whose changes
re-time every entry, so that the statistics can change without re-timing.

    s = speeds.speed(timing.time_point(lm, es, n_new, cfg))   # {"ratio", "lo", "hi", "verdict", "digits", ...}
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

# The run-to-run spread of a paired ratio: the standard deviation, in log space, of one configuration's ratio
# between independent timing runs of one commit, beyond what the spread over prompts inside one run shows (the
# process, its memory placement, what the other core does). A book page sets it from its profile
# (:func:`set_run_sd`, called by ``chapter.setup``); a bare library call leaves it 0, the within-run interval.
_RUN_SD = 0.0


def checked_run_sd(sd) -> float:
    """``sd`` as a run-to-run spread (a log-space standard deviation in [0, 1)), or a ValueError that says so."""
    try:
        x = float(sd)
    except (TypeError, ValueError):
        x = float("nan")
    if not (math.isfinite(x) and 0.0 <= x < 1.0):
        raise ValueError(f"the run-to-run spread (run_sd) must be a number in [0, 1), got {sd!r}")
    return x


def set_run_sd(sd: float) -> None:
    """Set the run-to-run spread (log-space standard deviation, :func:`checked_run_sd`) that :func:`paired_ratio`
    adds to every interval from here on, in this process."""
    global _RUN_SD
    _RUN_SD = checked_run_sd(sd)


def run_sd() -> float:
    """The run-to-run spread :func:`paired_ratio` adds now (see :func:`set_run_sd`)."""
    return _RUN_SD


# two-sided 95% quantiles of Student's t, by degrees of freedom (beyond 30: the normal's 1.96 is within 2%)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def t_half_width(x) -> float:
    """Half the width of the 95% t-interval of the mean of the values ``x`` (NaN with fewer than two)."""
    x = np.asarray(x, dtype=float)
    return t975(len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x)) if len(x) > 1 else float("nan")


def verdict(lo: float, hi: float) -> str:
    """A speed ratio's verdict from its 95% interval: "faster" or "slower" only when the interval excludes 1.0,
    else "no different" (also when there is no interval: NaN bounds)."""
    return "faster" if lo > 1.0 else "slower" if hi < 1.0 else "no different"


def paired_ratio(runs: pd.DataFrame, run_sd: float | None = None) -> dict:
    """The method's speed relative to its reference from :func:`~earlyexit.experiments.timing.paired_runs` rows (``group``, ``round``,
    ``ratio``, optionally ``group_ratio``): each group's ratio (its ``group_ratio`` where finite, the ratio of its
    steps' fastest times over the rounds, :func:`~earlyexit.experiments.timing.step_floor`; else its median ratio
    over rounds), their geometric mean over groups (``ratio``) and its 95%
    interval (``lo``, ``hi``): the t-interval over groups (with a single group, over its rounds' log ratios), its
    half-width in log space combined in quadrature with 1.96 run-to-run standard deviations ``run_sd`` (default:
    :func:`run_sd`), so that the interval covers what a second timing run of the same commit would read, not only
    this run's prompts. ``verdict`` is "faster" or "slower" only when the interval excludes 1.0, else "no
    different" (also when one run leaves no interval: ``lo`` and ``hi`` NaN); ``digits`` is how many decimals the
    interval supports (its half-width to one significant figure, 1 to 3); ``run_sd`` is the term used."""
    sd = _RUN_SD if run_sd is None else checked_run_sd(run_sd)
    per = runs.groupby("group")["ratio"].median()
    if "group_ratio" in runs.columns:
        floor = runs.groupby("group")["group_ratio"].first()
        per = floor.where(np.isfinite(floor), per)
    per = np.log(per.to_numpy(dtype=float))
    logs = per if len(per) > 1 else np.log(runs["ratio"].to_numpy())
    m = float(logs.mean())
    if len(logs) > 1:
        half = math.hypot(t_half_width(logs), 1.96 * sd)
        lo, hi = math.exp(m - half), math.exp(m + half)
    else:
        lo = hi = float("nan")
    width = (hi - lo) / 2 if math.isfinite(lo) else 0.005
    digits = max(1, min(3, -int(math.floor(math.log10(max(width, 1e-12))))))
    return {"ratio": math.exp(m), "lo": lo, "hi": hi, "verdict": verdict(lo, hi), "digits": digits,
            "groups": int(len(per)), "rounds": int(runs["round"].nunique()), "run_sd": sd}


def speed(tp: pd.DataFrame) -> dict:
    """The speed relative to full depth of a :func:`~earlyexit.experiments.timing.time_point` table (or several concatenated rows of one
    configuration), as :func:`paired_ratio` gives it: ratio, lo, hi, verdict, digits, groups, rounds, run_sd."""
    rows = [{"group": i, "round": k, "ratio": float(x), "group_ratio": float(getattr(r, "ratio", math.nan))}
            for i, r in enumerate(tp.itertuples()) for k, x in enumerate(str(r.round_ratios).split())]
    return paired_ratio(pd.DataFrame(rows))


def speed_table(times: pd.DataFrame, by: str) -> pd.DataFrame:
    """:func:`speed` of each configuration in ``times`` (concatenated :func:`~earlyexit.experiments.timing.time_point` tables told apart by
    column ``by``), in their order of appearance: one row per configuration, columns ratio, lo, hi, verdict,
    digits, groups, rounds, run_sd."""
    names = list(dict.fromkeys(times[by]))
    return pd.DataFrame([speed(times[times[by] == n]) for n in names], index=pd.Index(names, name=by))


def relative(a: pd.DataFrame, b: pd.DataFrame) -> dict:
    """The speed of configuration ``a`` over that of ``b``, both :func:`~earlyexit.experiments.timing.time_point` (or :func:`~earlyexit.experiments.timing.time_replay`)
    tables on the same prompts, each paired with full depth: per prompt, a's ratio over b's (full depth's speed
    in each window cancels), summarized as :func:`paired_ratio` does."""
    x = a.set_index("prompt")["ratio"] / b.set_index("prompt")["ratio"]
    return paired_ratio(pd.DataFrame({"group": range(len(x)), "round": 0, "ratio": x.to_numpy()}))

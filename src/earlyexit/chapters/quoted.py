"""The speed a page quotes for a drafter: timed again by the book's paired protocol, whatever grid chose it.

Chapter 7's grids (every draft depth and length, every training-free drafter) are a screen: each configuration is
run once per prompt, back to back with full depth, over a few prompts, and the cost model ranks them from the
calls those runs made. A speed the text quotes is a claim, so it is measured again as every quoted speed of the
book is (:func:`earlyexit.experiments.timing.paired_runs`): the drafter and full depth alternate on the same
prompts for several rounds, decoding steps only, and the ratio comes with a 95% interval
(:func:`earlyexit.experiments.speeds.paired_ratio`: over prompts, widened by the run-to-run spread). The timing
is cached by configuration, prompts and rounds, so chapter 8, which quotes chapter 7's drafters, reads the very
entry chapter 7 made: one value per fact.

Which drafter a page names is chosen by :func:`first_ranked`: the cost model's prediction prices calls that greedy
decoding fixes with unit costs timed in this build, which move between builds by more than the best drafters lie
apart, so within :data:`RANK_TOL` of the fastest prediction the drafter accepted most often is named.

    top = rows.loc[quoted.first_ranked(rows)]     # rows: predicted, acceptance
    s = quoted.paired(lm, tset, n_new, DecodeConfig.self_speculation(E, d), rounds=3)   # ratio, lo, hi, ...
    best = quoted.cited(best, s)           # a grid row whose speedup, speedup_lo, speedup_hi are the paired ones
"""
from __future__ import annotations

import pandas as pd

from ..experiments import speeds, timing
from . import words

# Three timing runs of one machine (cost model units timed with nothing beside them) put the trained model's four
# best layer-skip drafters at 0.91-0.93, 0.90-0.96 and 0.89-0.91 times full depth: one drafter's prediction moved
# by up to 0.06 between runs, and the one predicted fastest changed from "8 layers left out, d = 2" to "4 layers
# left out, d = 1". Predictions closer than this (relative to the fastest) are not ranked.
RANK_TOL = 0.05


def paired(lm, es, n_new: int, cfg, rounds: int) -> dict:
    """``cfg``'s speed relative to full depth on the prompts ``es`` (``n_new`` tokens each, ``rounds`` rounds,
    the two alternating): :func:`~earlyexit.experiments.speeds.paired_ratio`'s ratio, lo, hi, verdict, digits,
    groups, rounds."""
    return speeds.paired_ratio(timing.paired_runs(lm, es, n_new, cfg, rounds=rounds))


def first_ranked(rows: pd.DataFrame, pred: str = "predicted", tie: str = "acceptance", tol: float = RANK_TOL):
    """The index label of the configuration of ``rows`` that a page names as the cost model's first: among the
    rows whose prediction (``pred``) lies within ``tol`` of the highest (relative to it), the one with the highest
    ``tie`` (the acceptance, which greedy decoding fixes), the earliest on a tie. A build's unit costs move a
    prediction by a few hundredths, so the plain maximum names a different drafter from build to build where
    several lie that close; the one whose drafts are accepted most often is the least aggressive of those the
    cost model cannot tell apart, and the same in every build unless the band itself changes."""
    missing = [c for c in (pred, tie) if c not in rows.columns]
    if missing:
        raise ValueError(f"first_ranked needs the columns {pred!r} and {tie!r}; missing {missing}")
    if not 0 <= tol < 1:
        raise ValueError(f"tol is a relative band in [0, 1), got {tol}")
    p = pd.to_numeric(rows[pred], errors="coerce")
    if not p.notna().any():
        raise ValueError(f"no configuration with a finite {pred!r} to rank (rows: {len(rows)})")
    best = float(p.max())
    band = rows[p >= best - tol * abs(best)]
    return pd.to_numeric(band[tie], errors="coerce").fillna(-float("inf")).idxmax()


def named_drafters(summ: pd.DataFrame, dsumm: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per model, the lossless self-speculative configuration of ``summ`` and ``dsumm`` (summaries whose ``speed``
    is the cost model's) that chapter 8 names: :func:`first_ranked` over that speed and the mean acceptance of its
    ``runs`` (rows with model, method, label and acceptance), as chapter 7 names its drafters; indexed by model (a
    model with no lossless configuration has no row)."""
    if "acceptance" not in runs.columns:
        raise ValueError("named_drafters needs the acceptance of each run (a column 'acceptance' of runs)")
    pool = pd.concat([summ[summ.method == "self-speculation"], dsumm], ignore_index=True)
    pool = pool[pool["consistency"] >= 1 - 1e-9]
    acc = runs.groupby(["model", "method", "label"])["acceptance"].mean()
    pool = pool.assign(acceptance=[float(acc.get((m, me, la), float("nan")))
                                   for m, me, la in zip(pool["model"], pool["method"], pool["label"])])
    named = [first_ranked(g, pred="speed") for _, g in pool.groupby("model", sort=False)]
    return pool.loc[named].set_index("model")


def cited(row: pd.Series, s: dict, prefix: str = "speedup") -> pd.Series:
    """A copy of the grid row ``row`` whose ``{prefix}``, ``{prefix}_lo`` and ``{prefix}_hi`` are the paired
    ratio ``s`` (:func:`paired`), the rest (acceptance, layers, the cost model's prediction) as the grid measured."""
    out = row.copy()
    out[prefix], out[f"{prefix}_lo"], out[f"{prefix}_hi"] = s["ratio"], s["lo"], s["hi"]
    return out


def protocol_note(n_prompts: int, rounds: int, n_screen: int, screen_runs: int = 1, run_sd: float = 0.0) -> str:
    """How a quoted speed was timed (``n_prompts`` prompts, ``rounds`` rounds) and how its interval is made
    (:func:`~earlyexit.chapters.words.interval_rule` of ``run_sd``), beside how the screen it was chosen from was
    (``n_screen`` prompts, the fastest of ``screen_runs`` runs each), for the page's folded note."""
    if min(n_prompts, rounds, n_screen, screen_runs) < 1:
        raise ValueError("prompts, rounds, screen prompts and screen runs must each be >= 1, got "
                         f"{n_prompts}, {rounds}, {n_screen}, {screen_runs}")

    runs = "one run each" if screen_runs == 1 else f"the fastest of {screen_runs} runs each"
    return (f"each speed the text quotes is timed again on {words.count(n_prompts, 'prompt')}, the drafter and full depth "
            f"alternating for {words.count(rounds, 'round')}, decoding steps only (the prompt pass taken out of each run); "
            f"its ratio is the geometric mean over prompts of each prompt's ratio of step floors (each decoding step's "
            f"fastest time over the rounds, summed, for each), and "
            f"{words.interval_rule(run_sd)}. "
            f"The grid's own numbers are the screen that chose it: {words.count(n_screen, 'prompt')}, {runs}")

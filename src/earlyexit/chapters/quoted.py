"""The speed a page quotes for a drafter: timed again by the book's paired protocol, whatever grid chose it.

Chapter 7's grids (every draft depth and length, every training-free drafter) are a screen: each configuration is
run once per prompt, back to back with full depth, over a few prompts, and the cost model ranks them from the
calls those runs made. A speed the text quotes is a claim, so it is measured again as every quoted speed of the
book is (:func:`earlyexit.experiments.timing.paired_runs`): the drafter and full depth alternate on the same
prompts for several rounds, decoding steps only, and the ratio comes with a 95% interval
(:func:`earlyexit.experiments.speeds.paired_ratio`: over prompts, widened by the run-to-run spread). The timing
is cached by configuration, prompts and rounds, so chapter 8, which quotes chapter 7's drafters, reads the very
entry chapter 7 made: one value per fact.

    s = quoted.paired(lm, tset, n_new, DecodeConfig.self_speculation(E, d), rounds=3)   # ratio, lo, hi, ...
    best = quoted.cited(best, s)           # a grid row whose speedup, speedup_lo, speedup_hi are the paired ones
"""
from __future__ import annotations

import pandas as pd

from ..experiments import speeds, timing
from . import words


def paired(lm, es, n_new: int, cfg, rounds: int) -> dict:
    """``cfg``'s speed relative to full depth on the prompts ``es`` (``n_new`` tokens each, ``rounds`` rounds,
    the two alternating): :func:`~earlyexit.experiments.speeds.paired_ratio`'s ratio, lo, hi, verdict, digits,
    groups, rounds."""
    return speeds.paired_ratio(timing.paired_runs(lm, es, n_new, cfg, rounds=rounds))


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

    def p(n, w):
        return f"{n:d} {w}" + ("" if n == 1 else "s")

    runs = "one run each" if screen_runs == 1 else f"the fastest of {screen_runs} runs each"
    return (f"each speed the text quotes is timed again on {p(n_prompts, 'prompt')}, the drafter and full depth "
            f"alternating for {p(rounds, 'round')}, decoding steps only (the prompt pass taken out of each run); "
            f"its ratio is the geometric mean over prompts of each prompt's median ratio, and "
            f"{words.interval_rule(run_sd)}. "
            f"The grid's own numbers are the screen that chose it: {p(n_screen, 'prompt')}, {runs}")

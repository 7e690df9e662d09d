"""Words for measured speeds, shared by the chapters: a paired ratio (:func:`earlyexit.experiments.speeds.speed`)
printed to the decimals its interval supports, and a verdict that calls a method faster or slower only when the
interval excludes 1.0; lists and large counts in English.

    s = speeds.speed(timing.time_point(lm, es, n_new, cfg))
    ratio(s)                        # '0.93× [0.88, 0.98]'
    versus(s)                       # 'slower than full depth'
    sentence("Lazy recompute", s)   # 'Lazy recompute runs at 0.93× [0.88, 0.98] the speed of full depth: slower.'
"""
from __future__ import annotations

import math

from ..experiments import speeds


def _num(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def interval_rule(run_sd: float) -> str:
    """How a paired speed's 95% interval is made, as a clause for a page's protocol sentence ("…; the speed is
    the geometric mean over prompts of each prompt's ratio, and <this>"): the t-interval over prompts, widened
    by the run-to-run spread ``run_sd`` (log-space standard deviation, :func:`earlyexit.experiments.speeds.set_run_sd`)
    when it is not 0."""
    run_sd = speeds.checked_run_sd(run_sd)
    if run_sd == 0:
        return "its 95% interval is the t-interval over prompts"
    return (f"its 95% interval combines the t-interval over prompts with a run-to-run spread of "
            f"{100 * run_sd:.2g}% (one standard deviation of one ratio between timing runs of the same commit)")


def has_interval(s: dict) -> bool:
    """Whether the ratio came with an interval (more than one prompt or round was timed)."""
    return math.isfinite(s.get("lo", math.nan)) and math.isfinite(s.get("hi", math.nan))


def ratio(s: dict) -> str:
    """'r× [lo, hi]' (the 95% interval) at ``s["digits"]`` decimals; 'r× (one timed run, no interval)' when one
    run left no interval. Where the verdict excludes 1.0 but the bound nearest 1.0 would print as 1.0 (lo = 1.004
    at one decimal), more decimals are printed (up to 4), so that the interval a reader sees says what the verdict
    says: '1.1× [1.004, 1.2]' rather than '1.1× [1.0, 1.2]' beside 'faster'."""
    if not has_interval(s):
        return f"{_num(s['ratio'], 2)}× (one timed run, no interval)"
    d = int(s.get("digits", 2))
    digits = {"lo": d, "hi": d}
    near = {"faster": "lo", "slower": "hi"}.get(s.get("verdict"))
    while near and digits[near] < 4 and float(_num(s[near], digits[near])) == 1.0:
        digits[near] += 1
    return f"{_num(s['ratio'], d)}× [{_num(s['lo'], digits['lo'])}, {_num(s['hi'], digits['hi'])}]"


def versus(s: dict, ref: str = "full depth") -> str:
    """The verdict against ``ref``: 'faster than …' or 'slower than …' only when the interval excludes 1.0,
    else 'not measurably different from …' ('not compared with …' without an interval)."""
    if not has_interval(s):
        return f"one timed run, not compared with {ref}"
    v = s.get("verdict", "no different")
    if v == "faster":
        return f"faster than {ref}"
    if v == "slower":
        return f"slower than {ref}"
    return f"not measurably different from {ref}"


def sentence(name: str, s: dict, ref: str = "full depth") -> str:
    """'<name> runs at <ratio> the speed of <ref>: faster.' (or 'slower', or 'no measurable difference', or 'no
    verdict' without an interval)."""
    v = s.get("verdict", "no different")
    word = {"faster": "faster", "slower": "slower"}.get(v, "no measurable difference" if has_interval(s)
                                                           else "no verdict")
    return f"{name} runs at {ratio(s)} the speed of {ref}: {word}."


def count(n: int, noun: str) -> str:
    """'1 layer', '4 layers', '0 layers': ``n`` and ``noun``, plural unless ``n`` is 1."""
    return f"{n:,d} {noun}" + ("" if n == 1 else "s")


def listing(items) -> str:
    """'1', '1 and 2', '1, 2 and 3'."""
    items = [str(x) for x in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def sig1(x: float) -> str:
    """``x`` rounded to one significant figure, large counts in words: 0.07, 7, 50,000, 3 million, 2 billion."""
    if not (math.isfinite(x) and x > 0):
        return f"{x:g}"
    r = float(f"{x:.0e}")
    for v, word in ((1e12, "trillion"), (1e9, "billion"), (1e6, "million")):
        if r >= v:
            return f"{r / v:g} {word}"
    return f"{r:,.0f}" if r >= 1 else f"{r:g}"

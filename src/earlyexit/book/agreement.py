"""Do two builds of the same commit quote the same speeds? Every paired ratio a page glues reads
"r× [lo, hi]" (:mod:`earlyexit.chapters.words`); this module reads them from two folders of executed chapters
and says, key by key, whether the two measurements agree within their intervals and give the same verdict; and
which glued sentences change their words (numbers aside) between the two, since a verdict can also live in a
sentence ("Batching the recompute pays" against "indistinguishable").

    python -m earlyexit.book.agreement book/generated-run1 book/generated      # a table and summary lines
    python -m earlyexit.book.agreement --clear-timed                            # before a second timing run

A second timing run costs far less than a second build: clear the timed entries (:data:`TIMED`,
:func:`clear_timed`, which moves them to ``data/cleared-timings/<time>/`` so that a second run stopped half-way
loses nothing of the first), keep the rest of the result store, and run the book again; ``python -m earlyexit book
--retime`` does both. Besides "inside the other's interval" (:func:`agree`), each ratio's difference is checked
against its own 95% interval (:func:`consistent`).
"""
from __future__ import annotations

import math
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from statistics import NormalDist

import pandas as pd

from ..experiments.speeds import verdict
from .consistency import glued, is_figure, page_record, pages
from .params import COMMON

# the result-store kinds that hold wall-clock measurements (cleared between two timing runs)
TIMED = ("timing", "timing_replay", "spec_point", "side_by_side", "paired_timing", "cost_units", "cost_units_paths",
         "shape_units", "shape_spec")
RATIO = re.compile(r"^'?(\d+(?:\.\d+)?)× \[(\d+(?:\.\d+)?), (\d+(?:\.\d+)?)\]'?$")


SPEED_KEY = re.compile(r"speed|ratio|vs_hf")   # a glued number with _lo/_hi beside it that is a timed ratio


def _float(v) -> float | None:
    try:
        return float(str(v).strip().strip("'"))
    except ValueError:
        return None


def ratios(folder: Path) -> dict:
    """{(page, key): (ratio, lo, hi)} of every paired ratio the executed notebooks of ``folder`` glue: a string
    "r× [lo, hi]", or a number ``k`` (or ``k_speed``) glued beside ``k_lo`` and ``k_hi`` whose name says it is a
    speed (:data:`SPEED_KEY`)."""
    out = {}
    for nb in pages(folder):
        g = glued(nb)
        for k, v in g.items():
            m = RATIO.match(str(v).strip())
            if m:
                out[(nb.stem, k)] = tuple(float(x) for x in m.groups())
            elif k.endswith("_lo") and f"{k[:-3]}_hi" in g:
                base = k[:-3]
                key = base if base in g else f"{base}_speed" if f"{base}_speed" in g else None
                if key is None or not SPEED_KEY.search(key):
                    continue
                x, lo, hi = (_float(g[n]) for n in (key, k, f"{base}_hi"))
                if None not in (x, lo, hi) and all(map(math.isfinite, (x, lo, hi))):
                    out[(nb.stem, key)] = (x, lo, hi)
    return out


def agree(a: tuple, b: tuple) -> bool:
    """Two timings (ratio, lo, hi) of one configuration agree: each ratio lies in the other's 95% interval."""
    (x, xl, xh), (y, yl, yh) = a, b
    return xl <= y <= xh and yl <= x <= yh


def consistent(a: tuple, b: tuple) -> bool:
    """Two timings (ratio, lo, hi) of one configuration differ by no more than their difference's 95% interval
    allows: in log space, |log x - log y| is at most the hypotenuse of the two half-widths. :func:`agree` is the
    stricter test: two calibrated 95% intervals of equal width put each ratio inside the other's only about 83% of
    the time (the difference of two readings is sqrt(2) times one reading's spread)."""
    (x, xl, xh), (y, yl, yh) = a, b
    if not all(v > 0 and math.isfinite(v) for v in (x, xl, xh, y, yl, yh)):
        return False
    half = math.hypot((math.log(xh) - math.log(xl)) / 2, (math.log(yh) - math.log(yl)) / 2)
    return abs(math.log(x) - math.log(y)) <= half


def compare(a: Path, b: Path) -> pd.DataFrame:
    """One row per ratio glued in both folders: page, key, the two (ratio, lo, hi), ``agree`` (each build's
    ratio lies in the other's interval), ``consistent`` (:func:`consistent`) and ``same_verdict``."""
    ra, rb = ratios(a), ratios(b)
    rows = []
    for key in sorted(set(ra) & set(rb)):
        (x, xl, xh), (y, yl, yh) = ra[key], rb[key]
        rows.append({"page": key[0], "key": key[1], "a": x, "a_lo": xl, "a_hi": xh, "b": y, "b_lo": yl, "b_hi": yh,
                     "agree": agree(ra[key], rb[key]), "consistent": consistent(ra[key], rb[key]),
                     "same_verdict": verdict(xl, xh) == verdict(yl, yh)})
    return pd.DataFrame(rows, columns=["page", "key", "a", "a_lo", "a_hi", "b", "b_lo", "b_hi", "agree",
                                       "consistent", "same_verdict"])


def change_odds(a: tuple, b: tuple, run_sd: float) -> float:
    """The chance that two independent timing runs of one commit give one configuration different verdicts, from
    its two readings (ratio, lo, hi): each run's log ratio taken as the readings' mean log ratio plus a normal error
    of standard deviation ``run_sd`` (the profile's ``timing_run_sd``), its interval as the readings' mean
    half-width in log space. A ratio whose bound lies near 1.0 changes verdict about half the time whatever the
    protocol; one whose interval sits far from 1.0, or wide around it, almost never. NaN without intervals."""
    logs = [math.log(v) if v > 0 and math.isfinite(v) else math.nan for v in (*a, *b)]
    if any(math.isnan(v) for v in logs) or not run_sd > 0:
        return math.nan
    x, xl, xh, y, yl, yh = logs
    mu, half = (x + y) / 2, ((xh - xl) + (yh - yl)) / 4
    n = NormalDist()
    faster, slower = n.cdf((mu - half) / run_sd), n.cdf((-mu - half) / run_sd)
    same = faster ** 2 + slower ** 2 + max(0.0, 1 - faster - slower) ** 2
    return 1 - same


def summary(t: pd.DataFrame, run_sd: float | None = None) -> str:
    """One line: how many ratios, how many disagree, how many differ by more than their intervals allow, how
    many change verdict; with ``run_sd``, how many verdict changes two runs should expect (:func:`change_odds`)."""
    line = (f"{len(t)} paired ratios in both builds; {int((~t['agree']).sum())} disagree (one build's ratio outside "
            f"the other's interval); {int((~t['consistent']).sum())} differ by more than the difference's 95% "
            f"interval; {int((~t['same_verdict']).sum())} change verdict")
    if run_sd is None or not len(t):
        return line
    odds = [p for r in t.itertuples()
            if not math.isnan(p := change_odds((r.a, r.a_lo, r.a_hi), (r.b, r.b_lo, r.b_hi), run_sd))]
    near = sum(p >= 0.2 for p in odds)
    return (line + f", where a run-to-run spread of {run_sd:g} expects {math.fsum(odds):.1f} "
            f"({near} ratio{'' if near == 1 else 's'} with a bound so near 1.0 that two runs differ at least 1 time "
            f"in 5)")


def recorded_run_sd(*folders: Path) -> float:
    """The run-to-run spread (``timing_run_sd``) the executed pages of ``folders`` were built with, read from
    the parameters the runner recorded in each page (:func:`~earlyexit.book.consistency.page_record`), so that
    two builds are compared under the spread their intervals used. Falls back to the parameter's default where no
    page records one; a ValueError when the pages recorded different values (two builds with different spreads
    cannot share one expectation)."""
    seen = {float(v) for folder in folders for nb in pages(folder)
            if (v := page_record(nb).get("parameters", {}).get("timing_run_sd")) is not None}
    if len(seen) > 1:
        raise ValueError(f"the pages were built with different run-to-run spreads (timing_run_sd {sorted(seen)}): "
                         "compare two builds of one profile")
    return seen.pop() if seen else float(COMMON["timing_run_sd"].default)


NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*")


def wording(a: Path, b: Path) -> pd.DataFrame:
    """One row per glued sentence (a string with a letter in it, figures and citation notes aside) whose words
    differ between the folders once every number is masked: page, key, and the two texts. Numbers are compared by
    :func:`compare`; this finds the verdicts and clauses a sentence chooses from a measurement."""
    rows = []
    for nb in pages(a):
        other = Path(b) / nb.name
        if not other.exists():
            continue
        ga, gb = glued(nb), glued(other)
        for k in sorted(set(ga) & set(gb)):
            x, y = str(ga[k]), str(gb[k])
            if is_figure(k, x) or not re.search(r"[^\W\d_]{2}", x) or RATIO.match(x.strip()):
                continue
            if NUMBER.sub("#", x) != NUMBER.sub("#", y):
                rows.append({"page": nb.stem, "key": k, "a": x.strip("'\""), "b": y.strip("'\"")})
    return pd.DataFrame(rows, columns=["page", "key", "a", "b"])


def clear_timed(root=None, keep: bool = True) -> int:
    """Take every wall-clock entry (:data:`TIMED`) out of the result store, keep the rest; return how many files.
    The entries are moved, not deleted (``keep``): to ``<store>/../cleared-timings/<UTC time>/<kind>/``, so that a
    second timing run stopped after the clearing loses nothing of the first (move a folder's kinds back into the
    store to restore them). ``keep=False`` deletes them. A claim (an entry being computed) stays."""
    from ..store import results
    base = results._root(root)
    dest = base.parent / "cleared-timings" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    n = 0
    for kind in TIMED:
        for f in sorted((base / kind).glob("*")) if (base / kind).is_dir() else []:
            if not f.is_file() or f.suffix == ".claim":
                continue
            if keep:
                (dest / kind).mkdir(parents=True, exist_ok=True)
                f.replace(dest / kind / f.name)
            else:
                f.unlink()
            n += 1
    return n


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--clear-timed"]:
        print(f"moved {clear_timed()} timed result files ({', '.join(TIMED)}) to cleared-timings/ beside the store")
        return 0
    if len(args) != 2 or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args and args[0] in ("-h", "--help") else 2
    t = compare(Path(args[0]), Path(args[1]))
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(t.to_string(index=False))
    w = wording(Path(args[0]), Path(args[1]))
    for r in w.itertuples():
        print(f"{r.page} {r.key}:\n  a: {r.a}\n  b: {r.b}")
    print(summary(t, recorded_run_sd(Path(args[0]), Path(args[1]))))
    print(f"{len(w)} glued sentence{'' if len(w) == 1 else 's'} change wording (numbers aside)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

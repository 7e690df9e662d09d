"""The front page's bottom line: what the summary table says, in sentences built from it (tested)."""
from __future__ import annotations

from itertools import groupby

import pandas as pd

from .words import listing as _listing

# a predicted speed-up this close to 1 is within what the cost model can tell apart from full depth
PREDICTION_ERROR = 0.05


def _what(method: str, label: str) -> str:
    """The method at its operating point, named once: 'self-speculation at E=25 d=2' from the label 'self-spec E=25
    d=2' (a label that starts with a short form of the method's name), the label itself where it names the method."""
    first, _, rest = label.partition(" ")
    if rest and method.lower().startswith(first.lower()):
        return f"{method} at {rest}"
    return label if method in label else f"{method} at {label}"


def bottom_line(best: pd.DataFrame, names: dict, target: float, exact=("self-speculation",)) -> str:
    """The bottom line of ``best`` (:func:`earlyexit.experiments.compare.best_at` rows with ``model``,
    ``method``, ``label``, ``speed``, ``meets``; display ``names``): per model, how many methods keep the ``target``
    consistency at a point that exits, and the fastest of them by the cost model's speed, said to be faster or
    slower than full depth only beyond :data:`PREDICTION_ERROR`. Models whose answer reads the same (the same
    count, method, point and verdict) share one sentence, their predicted speeds listed in turn."""
    facts = []                                              # (model name, what is said, predicted speed or None)
    for key in [k for k in names if k in set(best["model"])]:
        b = best[(best.model == key) & best["meets"]]
        if b.empty:
            facts.append((names[key], None, None))
            continue
        top = b.loc[b["speed"].idxmax()]
        n, s = len(b), float(top["speed"])
        how = ("faster than full depth" if s > 1 + PREDICTION_ERROR else
               "slower than full depth" if s < 1 - PREDICTION_ERROR else "no faster than full depth")
        kind = " (exact by construction)" if top["method"] in exact else ""
        facts.append((names[key], (n, _what(str(top["method"]), str(top["label"])) + kind, how), s))
    out = []
    for said, group in groupby(facts, key=lambda f: f[1]):  # consecutive models that read the same
        models, _, speeds = zip(*group)
        on = f"On {models[0]}" if len(models) == 1 else f"On {_listing(models)} alike,"
        if said is None:
            out.append(f"{on} no method keeps a consistency of at least {target:.2f} with the full model.")
            continue
        n, what, how = said
        some = "one method keeps" if n == 1 else f"{n} methods keep"
        fastest = "it" if n == 1 else "the fastest of them"
        at = _listing(f"{x:.2f}×" for x in speeds) + (" full depth respectively" if len(speeds) > 1 else " full depth")
        out.append(f"{on} {some} a consistency of at least {target:.2f}; {fastest} is {what}, predicted at {at}: {how}.")
    return " ".join(out)

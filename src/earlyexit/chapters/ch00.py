"""The front page's bottom line: what the summary table says, in sentences built from it (tested)."""
from __future__ import annotations

import pandas as pd

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
    """One sentence per model of ``best`` (:func:`earlyexit.experiments.compare.best_at` rows with ``model``,
    ``method``, ``label``, ``speed``, ``meets``; display ``names``): how many methods keep the ``target``
    consistency at a point that exits, and the fastest of them by the cost model's speed, said to be faster or
    slower than full depth only beyond :data:`PREDICTION_ERROR`."""
    out = []
    for key in [k for k in names if k in set(best["model"])]:
        b = best[(best.model == key) & best["meets"]]
        name = names[key]
        if b.empty:
            out.append(f"On {name} no method keeps a consistency of {target:.2f} with the full model.")
            continue
        top = b.loc[b["speed"].idxmax()]
        n = len(b)
        some = "one method keeps" if n == 1 else f"{n} methods keep"
        s = float(top["speed"])
        how = ("faster than full depth" if s > 1 + PREDICTION_ERROR else
               "slower than full depth" if s < 1 - PREDICTION_ERROR else "no faster than full depth")
        fastest = "it" if n == 1 else "the fastest of them"
        kind = " (exact by construction)" if top["method"] in exact else ""
        what = _what(str(top["method"]), str(top["label"]))
        out.append(f"On {name} {some} a consistency of {target:.2f}; {fastest} is {what}{kind}, predicted at "
                   f"{s:.2f}× full depth: {how}.")
    return " ".join(out)

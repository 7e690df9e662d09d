"""Chapter 7's second peer, the economize library: its drafters beside ours as a table, and the sentences that
compare them (re-exported by :mod:`earlyexit.chapters.ch07`)."""
from __future__ import annotations

import pandas as pd

from ..book.agreement import agree
from ..experiments.metrics import ci


def economize_table(p2, lossless2, pairs: dict, error: str = ""):
    """Ours and economize's drafters side by side; the error when economize did not run."""
    if p2 is None:
        return pd.DataFrame({"economize": [error]}).style.hide(axis="index")
    return pd.DataFrame([{"drafter": k, "decoder": who, "speed-up over full depth [95% CI]": ci(p2.loc[(k, who)], "speedup"),
                          "acceptance": f"{p2.loc[(k, who), 'acceptance']:.0%}",
                          "lossless": f"{int(lossless2.loc[(k, who), 'sum'])}/{int(lossless2.loc[(k, who), 'size'])}"}
                         for k in pairs for who in ("ours", "economize")]).style.hide(axis="index")


def economize_notes(p2, lossless2, pairs: dict, error: str, skip_top: pd.Series, n_prompts: int) -> dict:
    """economize's fastest drafter against ours; when our fastest is the layer-skip drafter timed in the section
    before (``skip_top``), how much two timings of one configuration differ."""
    if p2 is None:
        return {"eco_best": "none", "eco_ours_best": "none", "eco_runs": f"did not run here ({error})",
                **dict.fromkeys(("eco_best_speed", "eco_ours_best_speed", "eco_ratio"), float("nan")),
                "eco_lossless": 0, "eco_n": 0, "eco_same_note": "",
                "eco_sentence": f"economize did not run here ({error}), so there is no second peer to compare."}
    eco, ours = p2.xs("economize", level="who"), p2.xs("ours", level="who")
    eb, ob = eco["speedup"].idxmax(), ours["speedup"].idxmax()
    el = lossless2.xs("economize", level="who")
    same = same_drafter_note(ours.loc[ob], skip_top, n_prompts) if ob == list(pairs)[-1] else ""
    return {"eco_runs": "runs here unchanged, on the same weights, prompts and thread count", "eco_best": eb,
            "eco_best_speed": float(eco.loc[eb, "speedup"]), "eco_lossless": int(el["sum"].sum()),
            "eco_n": int(el["size"].sum()), "eco_ours_best": ob, "eco_ours_best_speed": float(ours.loc[ob, "speedup"]),
            "eco_ratio": float(ours.loc[ob, "speedup"] / eco.loc[eb, "speedup"]), "eco_same_note": same,
            "eco_sentence": (f"economize runs here unchanged, on the same weights, prompts and thread count. Its fastest "
                             f"drafter here is “{eb}” at {float(eco.loc[eb, 'speedup']):.2f}× full-depth speed "
                             f"({int(el['sum'].sum())} of {int(el['size'].sum())} of its generations equal full depth "
                             f"token for token); ours, at best “{ob}”, reaches {float(ours.loc[ob, 'speedup']):.2f}×, "
                             f"{float(ours.loc[ob, 'speedup'] / eco.loc[eb, 'speedup']):.2f} times economize's best."
                             f"{same}")}


def same_drafter_note(now: pd.Series, before: pd.Series, n_prompts: int) -> str:
    """One sentence on two timings of one configuration (rows with speedup, speedup_lo, speedup_hi): ``now``
    here, ``before`` in the previous section: in agreement (:func:`agree`), or apart by more than the intervals
    allow (saying whose interval leaves out the other's ratio). Two timings that print the same at two decimals get
    the same sentence as two that agree, so that a repeated build's rounding does not change the page's words."""
    cols = ("speedup", "speedup_lo", "speedup_hi")
    x, lo, hi = (float(now[k]) for k in cols)
    y, blo, bhi = (float(before[k]) for k in cols)
    head = " Timed on its own in the previous section, the same drafter ran at"
    if agree((x, lo, hi), (y, blo, bhi)) or f"{x:.2f}" == f"{y:.2f}":
        return f"{head} {y:.2f}×, inside this timing's 95% interval, as two timings of one configuration should be."
    where = (f"outside this timing's 95% interval ({lo:.2f} to {hi:.2f})" if not lo <= y <= hi else
             f"with a 95% interval ({blo:.2f} to {bhi:.2f}) that has this timing's {x:.2f}× outside it")
    return (f"{head} {y:.2f}×, {where}: two timings of one configuration on {n_prompts} prompts differ by more than "
            f"their intervals allow, so read these intervals as too narrow.")

"""Chapter 8's batching paragraph: the confidence rule with copy-forward timed in turn with full depth at each
batch size, and the claim the verdicts support.

    bt = batches.batch_speeds(lm, es, n_new, P, P5)   # paired speed over full depth per batch size, timed as
                                                      # chapter 5 times it (P5: its parameters)
    batches.batch_notes(bt)                           # the glued words, with batch_claim
"""
from __future__ import annotations

import pandas as pd

from ..book import plots
from ..engine import DecodeConfig
from ..experiments import grouped, points, speeds
from . import words


def batch_claim(lo: dict, hi: dict) -> str:
    """The claim of the batching paragraph, from the rule's paired speed over full depth at the smallest batch
    (``lo``) and the largest (``hi``), each a :func:`earlyexit.experiments.speeds.speed` dict: a change is claimed
    only from the verdicts (intervals that exclude 1.0)."""
    v = (lo["verdict"], hi["verdict"])
    if v == ("faster", "faster"):
        return "Batches shrink the saving." if hi["ratio"] < lo["ratio"] else "Batches do not cost the rule its speed here."
    if lo["verdict"] == "faster":
        return "Batches erase the saving."
    if v == ("slower", "slower"):
        return ("Batches make a slow rule slower still." if hi["ratio"] < lo["ratio"]
                else "The rule is slower than the full model at every batch size.")
    if hi["verdict"] == "slower":
        return "In a batch the rule falls behind the full model."
    if hi["verdict"] == "faster":
        return "Batches help the rule here."
    if lo["verdict"] == "slower":
        return "In a batch the rule catches up with the full model."
    return "Neither alone nor in a batch does the rule measurably differ from the full model in speed."


def batch_speeds(lm, es, n_new: int, P, timed) -> pd.DataFrame:
    """The ``P["rule"]`` rule with copy-forward at the operating threshold, timed in turn with full depth
    (:func:`earlyexit.experiments.grouped.time_groups`) at each batch size of ``P["batch_sizes"]`` as chapter 5
    times it: ``timed`` is chapter 5's parameters, whose ``timing_prompts`` prompts (at batch 1), ``batch_groups``
    groups of prompts (in a batch) and ``timing_repeats`` rounds make the very entries chapter 5 quotes, one
    value per fact. Its paired speed over full depth (ratio, lo, hi, verdict, digits) and layers per token, indexed
    by batch."""
    ml = points.default_min_layer(P["min_layer"], lm.num_layers)
    cf = DecodeConfig.early_exit(P["rule"], "copy-forward", min_layer=ml, threshold=P["operating_threshold"])
    rows = []
    single = es.subset(min(len(es), int(timed["timing_prompts"])))
    for B, s in grouped.batch_sets(lm, es, P["batch_sizes"], int(timed["batch_groups"]), single).items():
        rule_t = grouped.time_groups(lm, s, n_new, cf, batch=B, repeats=int(timed["timing_repeats"]))
        rows.append({"batch": B, **speeds.speed(rule_t), "layers": float(rule_t["layers"].mean())})
    return pd.DataFrame(rows).set_index("batch")


def batch_table(bt: pd.DataFrame):
    """:func:`batch_speeds`' table for reading: batch size, paired speed over full depth with its interval, layers
    per token."""
    return plots.table(pd.DataFrame({"batch size": bt.index.to_numpy(),
                                     "speed / full depth [95% CI]": [words.ratio(r) for _, r in bt.iterrows()],
                                     "layers / token": bt["layers"].to_numpy()}), formats={"layers / token": "{:.1f}"})


def batch_notes(bt: pd.DataFrame) -> dict:
    """The smallest and largest batch of :func:`batch_speeds`' table ``bt``, the rule's paired speed at each (in
    words, with its interval), its layers per token at the largest, and :func:`batch_claim`."""
    lo, hi = int(bt.index.min()), int(bt.index.max())
    s_lo, s_hi = bt.loc[lo].to_dict(), bt.loc[hi].to_dict()
    return {"batch_lo": lo, "batch_hi": hi, "rel_lo": words.ratio(s_lo), "rel_hi": words.ratio(s_hi),
            "rel_lo_vs": words.versus(s_lo, "the full model"), "rel_hi_vs": words.versus(s_hi, "the full model"),
            "batch_layers": float(bt.loc[hi, "layers"]), "batch_claim": batch_claim(s_lo, s_hi)}

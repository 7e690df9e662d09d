"""Deciding with the head or without it, under one chapter's caches.

The softmax rule reads the vocabulary head at every layer where it may exit (on SmolLM2 a head evaluation costs
about eight decoder layers); state saturation (the hidden state stops changing) and CALM's learned exit
classifier (a small network on the hidden state, see :mod:`earlyexit.experiments.classify`) decide without it and
read the head once per token, at the exit. :func:`table` runs the three rules at their operating points with
each of a chapter's fill strategies on the chapter's prompts, and summarises consistency, layers and head
evaluations per token (mean and 95% bootstrap interval over prompts) and the batch's speed against full depth.

    folder = classify.classifier_for(lm, P)
    t = decisions.table(lm, es, P.max_new_tokens, P, ["lazy-recompute"], min_layer=C.min_layer, classifier=folder)
    decisions.shown(t)     # the table as the chapter prints it
"""
from __future__ import annotations

import pandas as pd

from ..engine import DecodeConfig
from . import points
from .metrics import ci
from .evalset import EvalSet

RULES = ("softmax", "saturation", "classifier")


def configs(P, strategies, min_layer: int, classifier: str) -> list[DecodeConfig]:
    """Each rule at its operating threshold (softmax and saturation: ``operating_threshold``; the classifier:
    ``clf_operating``) with each strategy."""
    out = []
    for s in strategies:
        out.append(DecodeConfig.early_exit("softmax", s, min_layer=min_layer, threshold=P["operating_threshold"]))
        out.append(DecodeConfig.early_exit("saturation", s, min_layer=min_layer,
                                           threshold=P["operating_threshold"]))
        out.append(DecodeConfig.early_exit("classifier", s, min_layer=min_layer, threshold=P["clf_operating"],
                                           classifier=classifier))
    return out


def table(lm, es: EvalSet, n_new: int, P, strategies, *, min_layer: int, classifier: str) -> pd.DataFrame:
    """One row per (rule, strategy): threshold; consistency (ROUGE-L of the tokens against the full model's),
    layers (recompute and copies' layers counted) and head evaluations per token, each with ``_lo``/``_hi`` (95%
    interval over prompts); ``speed``: the batch's tokens/s over full depth's in the same kind of run."""
    if not strategies:
        raise ValueError("no fill strategy given; valid: naive-mask, naive-undefined, copy-forward, "
                         "lazy-recompute, eager-recompute")
    cfgs = configs(P, strategies, min_layer, classifier)
    pts = points.sweep(lm, es, n_new, cfgs)
    pts["consistency"] = pts["rouge_full"]
    full = float(points.point(lm, es, n_new, DecodeConfig.full())["batch_tok_s"].iloc[0])
    summ = points.summary(pts, ["rule", "strategy"], ["consistency", "layers", "head_checks"], seed=P["seed"],
                          n_boot=P["n_boot"])
    speed = (pts.groupby(["rule", "strategy"])["batch_tok_s"].first() / full).rename("speed").reset_index()
    thr = pts.groupby(["rule", "strategy"])["threshold"].first().reset_index()
    out = summ.merge(speed, on=["rule", "strategy"]).merge(thr, on=["rule", "strategy"])
    order = {r: i for i, r in enumerate(RULES)}
    sorder = {s: i for i, s in enumerate(strategies)}
    out = out.sort_values(["strategy", "rule"], key=lambda c: c.map(sorder if c.name == "strategy" else order))
    return out.reset_index(drop=True)


def shown(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`table` as a chapter prints it: one readable row per (rule, strategy)."""
    name = {"softmax": "softmax (reads the head)", "saturation": "state saturation",
            "classifier": "exit classifier"}
    return pd.DataFrame({
        "exit decision": [f"{name.get(r, r)} {t:g}" for r, t in zip(t["rule"], t["threshold"])],
        "cache": t["strategy"],
        "consistency [95% CI]": [ci(r, "consistency") for _, r in t.iterrows()],
        "layers / token": [ci(r, "layers", "{:.1f}") for _, r in t.iterrows()],
        "head evaluations / token": [ci(r, "head_checks", "{:.1f}") for _, r in t.iterrows()],
        "speed vs full depth": [f"{s:.2f}x" for s in t["speed"]],
    })


def row(t: pd.DataFrame, rule: str, strategy: str) -> pd.Series:
    """The row of ``rule`` with ``strategy`` (ValueError naming the rows there are)."""
    hit = t[(t["rule"] == rule) & (t["strategy"] == strategy)]
    if hit.empty:
        have = ", ".join(f"{r}/{s}" for r, s in zip(t["rule"], t["strategy"]))
        raise ValueError(f"no row {rule}/{strategy}; the table has {have}")
    return hit.iloc[0]

"""Chapter 4, recomputing the holes lazily: the layer accounting (figure and table), the check, timing and quality
tables as a reader sees them, and the sentences whose wording depends on the accounting and the timings."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..book import figures, plots
from ..experiments import metrics
from . import words

LAYER_PARTS = {"own_layers": "run by the token", "recompute_layers": "recomputed later",
               "pending_layers": "never run (pending at the end)"}


def check_table(check: pd.DataFrame):
    """Oracle exits prompt by prompt (``check``: indexed by prompt, columns kind, one 0/1 column per recompute
    strategy, tokens): whether each strategy's output equals full depth's."""
    same = {s: f"{s.split('-')[0]} = full depth" for s in ("lazy-recompute", "eager-recompute") if s in check}
    shown = check.assign(**{s: check[s].map(lambda v: "yes" if v == 1 else "no") for s in same})
    return plots.table(shown, {"prompt": "prompt", "kind": "kind", **same, "tokens": "tokens generated"})


def accounting(pts: pd.DataFrame) -> pd.DataFrame:
    """Per point ("0.99, lazy", "oracle, eager", ...): the mean layers per token run by the token, recomputed later
    and never run, their ``total``, the FLOPs over full depth, head evaluations and ROUGE-L against the full model."""
    point = [("oracle" if r == "oracle" else f"{t:g}") + f", {s.split('-')[0]}" for r, t, s in
             zip(pts["rule"], pts["threshold"], pts["strategy"])]
    acc = pts.assign(point=point).groupby("point", sort=False)[
        [*LAYER_PARTS, "flop_fraction", "head_checks", "rouge_full"]].mean()
    return acc.assign(total=acc[list(LAYER_PARTS)].sum(axis=1))


def accounting_figure(acc: pd.DataFrame, L: int, rule: str):
    """Each point's layers per token, stacked: run by the token, recomputed later, never run (dotted: the depth)."""
    fig, ax = figures.subplots(width=figures.FULL_WIDTH * 0.62, aspect=0.62)
    x, bottom = np.arange(len(acc)), np.zeros(len(acc))
    for (col, name), c in zip(LAYER_PARTS.items(), figures.palette(3)):
        ax.bar(x, acc[col], bottom=bottom, color=c, label=name, width=0.7)
        bottom += acc[col].to_numpy()
    ax.axhline(L, color="0.3", lw=0.6, ls=":")
    ax.set(xticks=x, ylabel="decoder layers per generated token", xlabel=f"{rule} threshold (or oracle), strategy")
    ax.set_xticklabels(acc.index, rotation=30, ha="right")
    plots.legend_below(fig)
    return fig


def accounting_table(acc: pd.DataFrame):
    """:func:`accounting` as the page shows it (without the total, the model's depth: the figure draws it)."""
    return plots.table(acc, {"point": "threshold, recompute", "own_layers": "own layers / token",
                             "recompute_layers": "recomputed layers / token",
                             "pending_layers": "never-run layers / token", "flop_fraction": "FLOPs / full depth",
                             "head_checks": "head evaluations / token", "rouge_full": "ROUGE-L vs full"},
                       {"head_checks": "{:.1f}"})


def timing_table(ts: pd.DataFrame, lay: pd.Series):
    """The timed methods (``ts``: paired speeds over full depth indexed by method,
    :func:`earlyexit.experiments.speeds.speed_table`; ``lay``: layer evaluations per token)."""
    return plots.table(pd.DataFrame({"method": ts.index, "speed / full depth (batch 1) [95% CI]": [
        words.ratio(r) for _, r in ts.iterrows()],
        "layer evaluations / token": lay.loc[ts.index].to_numpy()}), formats={"layer evaluations / token": "{:.1f}"})


def quality_table(summ: pd.DataFrame):
    """Every cache's sweep points: layers per token and ROUGE-L against the full model (means, 95% intervals)."""
    return plots.table(pd.DataFrame({
        "cache": summ["strategy"], "operating point": summ["label"],
        "layers / token (recompute counted)": [metrics.ci(r, "layers", "{:.1f}") for _, r in summ.iterrows()],
        "ROUGE-L vs full, mean [95% CI]": [metrics.ci(r, "rouge_full") for _, r in summ.iterrows()]}))


def parts_add_up(L: int, max_dev: float) -> str:
    """Whether own, recomputed and never-run layers add up to the model's depth ``L`` at every point; ``max_dev``
    is the largest deviation of their sum from ``L`` (the rounding of averages)."""
    if round(max_dev, 2) == 0:
        return f"The three parts add up to exactly {L} layers for every point."
    return (f"The three parts add up to {L} layers for every point, to within {max_dev:.2f} layers (the rounding "
            f"of the averages).")


def oracle_saving(pending: float) -> str:
    """What lazy recompute leaves unrun per token under oracle exits (``pending``: layers never run)."""
    if round(pending, 1) == 0:
        return ("under oracle exits no layer is saved at all: every layer a token skipped is recomputed for a later "
                "token before the generation ends")
    return f"under oracle exits only {pending:.1f} layers per token are saved"


def lazy_vs_eager(s: dict) -> str:
    """Lazy against eager recompute with the same exits: ``s`` is lazy's speed over eager's per prompt, each
    paired with full depth (:func:`earlyexit.experiments.speeds.relative`). A verdict only when the 95% interval
    excludes 1."""
    if s["verdict"] == "faster":
        return (f"Batching the recompute pays: with the same exits, lazy recompute decodes at {words.ratio(s)} "
                f"eager recompute's speed.")
    if s["verdict"] == "slower":
        return (f"With the same exits, lazy recompute is slower than eager recompute ({words.ratio(s)} its speed): "
                f"at batch 1 on this CPU, batching the recompute does not pay for the bookkeeping of pending tokens, "
                f"which this engine does in Python, one sequence at a time, for readability.")
    if not words.has_interval(s):
        return f"With the same exits, lazy recompute runs at {words.ratio(s)} eager recompute's speed."
    return (f"With the same exits, lazy and eager recompute are indistinguishable here (lazy at {words.ratio(s)} "
            f"eager's speed, an interval that holds 1): at batch 1 on this CPU the batching neither pays nor costs "
            f"measurably.")

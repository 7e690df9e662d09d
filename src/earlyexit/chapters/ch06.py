"""Chapter 6, training for early exit: the recipe's schedules, the training curves, every layer read before and
after training, the continual runs side by side and the from-scratch pair, and the words the page chooses from
their results (within or outside the perplexity goal, raises or lowers, ...).

The notes functions return ``{glue key: value}`` for the page's prose; the figure functions return a figure the
notebook publishes under its own name.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .. import paths
from ..book import figures, plots
from ..engine.models import SCRATCH
from ..experiments import metrics
from ..training.recipe import curriculum_layers, exit_loss_weights, layer_dropout_rates

PPL_GOAL = 0.05  # issue 5: the full model's perplexity may change by at most this fraction


# --------------------------------------------------------------------------- words


def goal_word(change: float, goal: float = PPL_GOAL) -> str:
    """Whether a relative change of the last layer's perplexity is "within" or "outside" the ``goal``."""
    return "within" if abs(change) <= goal else "outside"


def head_phrase(train_embeddings: bool) -> str:
    """What the run does with the tied embedding and shared head."""
    return "the head is trained too" if train_embeddings else "the head is frozen"


def trained_now_phrase(trained_now: bool) -> str:
    """Whether the checkpoint was trained by this build or found from an earlier one."""
    return "trained in this run" if trained_now else "reused from an earlier run with the same parameters"


def measurably(a_lo: float, a_hi: float, b_lo: float, b_hi: float) -> int:
    """+1 where the interval ``a`` lies wholly above ``b``, -1 wholly below, 0 where the two overlap."""
    return 1 if a_lo > b_hi else (-1 if a_hi < b_lo else 0)


def light_verdict(order: int) -> str:
    """The lighter dose's agreement against the full dose's (``order`` from :func:`measurably`)."""
    return {1: "higher than", -1: "lower than", 0: "not measurably different from"}[order]


def above_off_verdict(order: int) -> str:
    """The lighter dose's agreement against the recipe-off run's (``order`` from :func:`measurably`)."""
    return {1: "above", -1: "below", 0: "not measurably above"}[order]


def distill_verdict(order: int) -> str:
    """What self-distillation does to the agreement LayerSkip's target reaches (``order``: :func:`measurably`)."""
    return {1: "raises", -1: "lowers", 0: "does not measurably change"}[order]


def kept_phrase(kept: float) -> str:
    """How much of the full dose's agreement gain over the recipe-off run the lighter dose keeps (``kept``: a
    fraction, NaN where the full dose gains nothing)."""
    if math.isnan(kept):
        return "keeps nothing of the agreement gain, since the full dose buys none over the recipe-off run"
    if kept <= 0:
        return "keeps none of the agreement gain that the full dose buys over the recipe-off run"
    return f"keeps {kept:.0%} of the agreement gain that the full dose buys over the recipe-off run"


def scratch_description(name: str) -> str:
    """The from-scratch configuration ``name`` (one of the engine's small configs) in words."""
    c = SCRATCH[name]
    return f"{name}: {c['num_hidden_layers']} layers of width {c['hidden_size']}, the same tokenizer"


# --------------------------------------------------------------------------- the recipe


def schedule_notes(cfg, L: int) -> dict:
    """The rotational period R, the exits' loss scale and the exit heads a step pays for on average, for the
    training configuration ``cfg`` of an ``L``-layer model."""
    R = cfg.resolved_param(L)
    n = [len(curriculum_layers(cfg.curriculum, t, L, R)) for t in range(max(1, R or 1))]
    return {"R_rot": int(R or 1), "e_scale": cfg.e_scale, "n_exit_mean": float(np.mean(n))}


def recipe_figure(cfg, L: int):
    """(a) The layer dropout rate of each layer; (b) the early-exit loss weights of the layers that carry a loss
    at the first steps of the curriculum (each step's weights sum to one)."""
    rates = layer_dropout_rates(L, cfg.p_max).numpy()
    R = cfg.resolved_param(L)
    steps_shown = list(range(min(4, max(1, R or 1))))
    fig, axes = figures.subplots(1, 2, width=figures.FULL_WIDTH * 0.85, aspect=0.7)
    axes[0].plot(np.arange(1, L + 1), rates, marker="o", ms=2.5, color=figures.palette(1)[0])
    axes[0].set(xlabel="layer", ylabel="layer dropout rate $p_\\ell$", ylim=(0, None), title="(a) layer dropout")
    for t, c in zip(steps_shown, figures.palette(len(steps_shown))):
        on = curriculum_layers(cfg.curriculum, t, L, R)
        w = exit_loss_weights(on, L, cfg.scale, cfg.e_scale).numpy()
        axes[1].plot(np.array(on) + 1, w, marker="o", ms=3, lw=0.8, color=c, label=f"step {t}")
    axes[1].set(xlabel="layer", ylabel="early-exit loss weight", ylim=(0, None), title="(b) loss weights")
    axes[1].legend(loc="upper left")
    return fig


# --------------------------------------------------------------------------- continual pre-training


def config_notes(cfg, lm) -> dict:
    """The continual run's settings the prose quotes, and the head's size on the model ``lm``."""
    return {"p_max": cfg.p_max, "steps": cfg.steps, "batch_size": cfg.batch_size, "seq_len": cfg.seq_len,
            "lr": cfg.lr, "train_embeddings_str": head_phrase(cfg.train_embeddings),
            "vocab": int(lm.config.vocab_size), "hidden": int(lm.config.hidden_size)}


def seconds_per_step(runs: dict) -> dict:
    """{name: training seconds a step} of finished runs ({name: checkpoints.Run})."""
    return {k: r.seconds / max(1, len(r.history["step"])) for k, r in runs.items()}


def run_notes(run, hist: pd.DataFrame, precision: str) -> dict:
    """How long the run ``run`` (its history ``hist``) took, in which ``precision``, and where its checkpoint is."""
    return {"train_minutes": run.seconds / 60, "s_per_step": float(hist["seconds"].median()),
            "precision_str": precision, "trained_now": trained_now_phrase(run.trained_now),
            "ckpt": paths.relative(run.checkpoint)}


def curve_figure(hist: pd.DataFrame):
    """Training loss per step (faint) and as a running mean: the last layer's and the weighted early-exit loss."""
    fig, ax = figures.subplots(aspect=0.65)
    k = max(1, len(hist) // 10)
    c = figures.palette(2)
    for col, color, label in (("final_ce", c[0], "last layer"), ("loss", c[1], "weighted early-exit loss $J$")):
        ax.plot(hist["step"], hist[col], color=color, alpha=0.35, lw=0.8)
        ax.plot(hist["step"], hist[col].rolling(k, min_periods=1).mean(), color=color, label=label)
    ax.set(xlabel="optimizer step", ylabel="training loss (nats/token)")
    ax.legend(loc="upper right")
    return fig


def stack(tables: dict) -> pd.DataFrame:
    """:func:`~earlyexit.experiments.trained.layer_agreement` tables ({model: table}) in one, with a ``model``
    column."""
    return pd.concat([t.assign(model=k) for k, t in tables.items()], ignore_index=True)


def _layer_panels(axes, sa, sl, colors: dict, labels: dict, ms: float) -> None:
    """Agreement (mean and interval) on ``axes[0]`` and perplexity on ``axes[1]``, one line per model."""
    for m, color in colors.items():
        g = sa[sa.model == m]
        axes[0].fill_between(g["layer"], g["lo"], g["hi"], color=color, alpha=0.25, lw=0)
        axes[0].plot(g["layer"], g["mean"], marker="o", ms=ms, color=color, label=labels[m])
        g = sl[sl.model == m]
        axes[1].fill_between(g["layer"], np.exp(g["lo"]), np.exp(g["hi"]), color=color, alpha=0.25, lw=0)
        axes[1].plot(g["layer"], np.exp(g["mean"]), marker="o", ms=ms, color=color, label=labels[m])


def layers_figure(sa: pd.DataFrame, sl: pd.DataFrame, names: dict):
    """Each layer read through the final norm and the shared head before and after training: (a) agreement with
    the last layer, (b) held-out perplexity; ``sa``/``sl`` summarize agreement/loss by model ("before",
    "after") and layer; ``names`` labels the two."""
    fig, axes = figures.subplots(1, 2, width=figures.FULL_WIDTH, aspect=0.7)
    _layer_panels(axes, sa, sl, {"before": figures.palette(2)[0], "after": figures.palette(2)[1]}, names, 2.5)
    axes[0].set(xlabel="exit after layer", ylabel="top-1 agreement with the last layer", ylim=(0, 1.02),
                title="(a) agreement")
    axes[1].set(xlabel="exit after layer", ylabel="held-out perplexity", yscale="log", title="(b) perplexity")
    axes[0].legend(loc="upper left")
    return fig


def recipe_tables(shown: pd.DataFrame):
    """:func:`~earlyexit.experiments.trained.recipe_shown`'s table as two that fit the page: each run's agreement
    with the last layer at the quoted layers, then its held-out perplexity, the changes and the cost of a step."""
    ag = [c for c in shown.columns if c.startswith("agreement, ")]
    rest = {"last-layer perplexity": "last-layer perplexity (held out)", "vs released": "change vs released [95% CI]",
            "vs recipe off": "change vs recipe off [95% CI]", "s/step": "seconds / training step"}
    return plots.tables([
        plots.table(shown, {"run": "run", **{c: c.replace("agreement, ", "") for c in ag}},
                    caption="Top-1 agreement with the last layer, mean [95% CI]"),
        plots.table(shown, {"run": "run", **{c: h for c, h in rest.items() if c in shown}},
                    caption="Held-out perplexity and the cost of a step")])


def marks(L: int) -> list[int]:
    """The layers the prose quotes on an ``L``-layer model: half and three quarters of the depth, and the one
    below the last."""
    return sorted({max(1, round(L * f)) for f in (0.5, 0.75)} | {L - 1})


def change_notes(ag: pd.DataFrame, sa: pd.DataFrame, sl: pd.DataFrame, L: int, n_boot: int, seed: int) -> dict:
    """What training changed, from the stacked agreement table ``ag`` (models "before", "after") and its
    summaries ``sa``/``sl``: agreement at :func:`marks`, the last layer's perplexity change (paired over blocks,
    95% interval) against :data:`PPL_GOAL`, the largest agreement gain below the last layer, and the perplexity
    of an exit at the first mark."""
    out = {}
    ms = marks(L)
    for i, l in enumerate(ms):
        r = sa[sa.layer == l].set_index("model")["mean"]
        out |= {f"mark{i}": int(l), f"ag_before_{i}": float(r["before"]), f"ag_after_{i}": float(r["after"])}
    piv = ag.pivot_table(index=["block", "layer"], columns="model", values=["agreement", "loss"]).reset_index()
    last = piv[piv.layer == L]
    d = (last[("loss", "after")] - last[("loss", "before")]).to_numpy()
    m, lo, hi = metrics.bootstrap_ci(d, n_boot=n_boot, seed=seed)
    out |= {"ppl_before": float(np.exp(last[("loss", "before")].mean())),
            "ppl_after": float(np.exp(last[("loss", "after")].mean())),
            "ppl_change": math.expm1(m), "ppl_change_lo": math.expm1(lo), "ppl_change_hi": math.expm1(hi),
            "ppl_goal_frac": PPL_GOAL, "ppl_goal": goal_word(math.expm1(m))}
    by = {k: sa[sa.model == k].set_index("layer")["mean"] for k in ("before", "after")}
    gain = (by["after"] - by["before"]).iloc[:-1]
    mid = sl[(sl.layer == ms[0])].set_index("model")["mean"]
    return out | {"gain_max": float(gain.max()), "gain_layer": int(gain.idxmax()),
                  "mid_ppl_before": float(np.exp(mid["before"])), "mid_ppl_after": float(np.exp(mid["after"]))}


def variant_notes(rt: pd.DataFrame, top: int, recipes: dict) -> dict:
    """The continual runs side by side (``rt``: :func:`~earlyexit.experiments.trained.recipe_table`) at layer
    ``top``: each run's agreement and perplexity, its cost against the recipe-off run and whether that is within
    :data:`PPL_GOAL`, what continued training alone does, and how the lighter dose (its settings from
    ``recipes["light"]``) and self-distillation compare with LayerSkip's run."""
    rr = rt.set_index("run")
    ag = f"ag_{top}"
    out = {"n_variants": len(rr), "var_top": int(top)}
    for k in rr.index:
        out |= {f"var_ag_{k}": float(rr.loc[k, ag]), f"var_ppl_{k}": float(rr.loc[k, "ppl"])}
        if "baseline" in rr.index and k != "baseline":
            out |= {f"var_cost_{k}{s}": float(rr.loc[k, f"ppl_vs_baseline{s}"]) for s in ("", "_lo", "_hi")}
            out[f"var_goal_{k}"] = goal_word(rr.loc[k, "ppl_vs_baseline"])
    if "baseline" in rr.index:
        out |= {f"var_adapt{s}": float(rr.loc["baseline", f"ppl_vs_before{s}"]) for s in ("", "_lo", "_hi")}

    def order(a, b):
        return measurably(rr.loc[a, f"{ag}_lo"], rr.loc[a, f"{ag}_hi"], rr.loc[b, f"{ag}_lo"], rr.loc[b, f"{ag}_hi"])

    if {"light", "layerskip", "baseline"} <= set(rr.index):
        full_gain = rr.loc["layerskip", ag] - rr.loc["baseline", ag]
        kept = float((rr.loc["light", ag] - rr.loc["baseline", ag]) / full_gain) if full_gain > 0 else float("nan")
        out |= {"light_p_max": recipes["light"].cfg.p_max, "light_e_scale": recipes["light"].cfg.e_scale,
                "light_kept": kept, "light_kept_str": kept_phrase(kept),
                "light_verdict": light_verdict(order("light", "layerskip")),
                "light_above_off": above_off_verdict(order("light", "baseline"))}
    if {"distill", "layerskip"} <= set(rr.index):
        out |= {"distill_gain": float(rr.loc["distill", ag] - rr.loc["layerskip", ag]),
                "distill_verdict": distill_verdict(order("distill", "layerskip"))}
    return out


# --------------------------------------------------------------------------- from scratch


def pair_figure(histories: dict, ssa: pd.DataFrame, ssl: pd.DataFrame):
    """The from-scratch pair ("baseline", "LayerSkip"): (a) last-layer training loss (running mean) from their
    ``histories``, (b) agreement with the last layer and (c) held-out perplexity of each exit (``ssa``/``ssl``:
    summaries by model and layer)."""
    pc = dict(zip(["baseline", "LayerSkip"], figures.palette(4)[2:4]))
    fig, axes = figures.subplots(1, 3, width=figures.FULL_WIDTH, aspect=0.85)
    for k, h in histories.items():
        kk = max(1, len(h) // 10)
        axes[0].plot(h["step"], h["final_ce"].rolling(kk, min_periods=1).mean(), color=pc[k], label=k)
        _layer_panels(axes[1:], ssa, ssl, {k: pc[k]}, {k: k}, 3)
    axes[0].set(xlabel="optimizer step", ylabel="last-layer training loss (nats)", title="(a) training")
    axes[1].set(xlabel="exit after layer", ylabel="agreement with the last layer", ylim=(0, 1.02),
                title="(b) agreement")
    axes[2].set(xlabel="exit after layer", ylabel="held-out perplexity", yscale="log", title="(c) perplexity")
    axes[0].legend(loc="upper right")
    return fig


def scratch_notes(sag: pd.DataFrame, L: int, seconds: dict, n_boot: int, seed: int) -> dict:
    """The from-scratch pair on held-out text (``sag``: stacked agreement tables, models "baseline" and
    "LayerSkip", ``L`` layers): perplexity and agreement at half depth and at the last layer, what the recipe
    costs the last layer (paired over blocks, 95% interval) and the seconds a step each (``seconds``)."""
    sp = sag.pivot_table(index=["block", "layer"], columns="model", values=["agreement", "loss"]).reset_index()
    out = {}
    for key, l in (("half", max(1, L // 2)), ("last", L)):
        g = sp[sp.layer == l]
        out[f"s_{key}"] = int(l)
        for k in ("baseline", "LayerSkip"):
            out[f"s_ppl_{key}_{k}"] = float(np.exp(g[("loss", k)].mean()))
            out[f"s_ag_{key}_{k}"] = float(g[("agreement", k)].mean())
    g = sp[sp.layer == L]
    m, lo, hi = metrics.bootstrap_ci((g[("loss", "LayerSkip")] - g[("loss", "baseline")]).to_numpy(), n_boot=n_boot,
                                     seed=seed)
    return out | {"s_cost": math.expm1(m), "s_cost_lo": math.expm1(lo), "s_cost_hi": math.expm1(hi),
                  "s_sec_base": seconds["baseline"], "s_sec_ls": seconds["LayerSkip"],
                  "s_sec_ratio": seconds["LayerSkip"] / seconds["baseline"]}

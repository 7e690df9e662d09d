"""Chapter 8, which fix at what cost: every method on every model in one Pareto figure and one table, the error
split into exit decision and cache, a threshold calibrated with Learn then Test, and the batching argument, with
the words the page chooses from those results (which methods reach the target, the fastest lossless drafter,
whether the guarantee holds, what batching does to the saving). Notes functions return ``{glue key: value}``;
figure functions return a figure the notebook publishes under its own name.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..book import figures, handoff, plots
from ..book.profiles import load_profile
from ..engine import DecodeConfig
from ..experiments import compare, costs, metrics, points, timing, trained
from . import quoted
from .batches import batch_claim, batch_notes, batch_speeds, batch_table  # noqa: F401 (chapter 8's API)

# how the prose names the models chapter 7's drafters run on
WHERE = {"released": "on the released model", "trained": "after LayerSkip training",
         "distill": "on the self-distilled model of chapter 6"}
NOT_TRAINED = "not trained under this profile"
# the methods whose best point the prose quotes, model by model
QUOTED = ("lazy-recompute", "eager-recompute", "copy-forward", "naive-mask", "SkipDecode", *compare.CLASSIFIED)


def chapter_params(P, name: str):
    """Chapter ``name``'s parameters under the profile chapter 8 runs with (``P["profile"]``).

    Chapter 8 compares what chapters 6, 7 and 9 measured: chapter 6's held-out blocks, chapter 7's drafters and
    timed points, chapter 9's exit classifier and cost units. Their results are cached under the parameters they
    were computed with, so chapter 8 asks with those same parameters, read from the same profile, and gets their
    points back instead of computing (or timing) different ones."""
    return load_profile(P["profile"]).parameters(name)


def compared_models(P, released, keys) -> dict:
    """The models of ``keys`` ("released", "trained", "scratch-baseline", ...): ``released`` itself, or the
    checkpoint chapter 6 trains for it under ``P``'s profile ("trained" is its LayerSkip run)."""
    return {k: released if k == "released" else handoff.load_trained(P, "layerskip" if k == "trained" else k)
            for k in keys}


def drafting_models(P, models: dict) -> dict:
    """The models chapter 7's drafters run on: the released and the trained one where ``models`` has them, and
    the self-distilled one where chapter 6 trains it under ``P``'s profile."""
    out = {k: models[k] for k in ("released", "trained") if k in models}
    if "distill" in handoff.recipes(P["profile"], P["model"]):
        out["distill"] = handoff.load_trained(P, "distill")
    return out


# --------------------------------------------------------------------------- words


def method_names(names) -> str:
    """Method names joined for a glued value: "none", one name, or "a; b" (names may hold commas)."""
    names = list(names)
    return "; ".join(names) if names else "none"


def reaching_sentence(names) -> str:
    """Which methods reach the target consistency, as a clause."""
    names = list(names)
    if not names:
        return "no method reaches the target"
    if len(names) == 1:
        return f"only {names[0]} reaches the target"
    return f"the methods that reach the target are: {method_names(names)}"


def reach_word(meets: bool) -> str:
    """Whether a method's best point reaches the target consistency."""
    return "reaches" if meets else "does not reach"


def thresholds_phrase(thresholds) -> str:
    """"threshold 0.5" or "thresholds 0.1, 0.3 and 0.5"."""
    t = [f"{x:g}" for x in thresholds]
    return f"threshold {t[0]}" if len(t) == 1 else f"thresholds {', '.join(t[:-1])} and {t[-1]}"


def lossless_phrase(n_lossless: int, n_runs: int) -> str:
    """Whether every drafter run kept the full model's output."""
    if n_lossless == n_runs:
        return f"keep every output too ({n_lossless} of {n_runs} prompt runs equal full depth)"
    return f"keep the full model's output in {n_lossless} of {n_runs} prompt runs, not in every one"


def fastest_sentence(shown: dict) -> str:
    """The fastest lossless configuration of each model of ``shown`` ({model: (what, predicted, measured, lo, hi)}:
    the cost model's speed-up and chapter 7's measurement with its interval; a NaN prediction for a model not
    trained under this profile), as a list of clauses."""
    return "; ".join(f"{WHERE[k]}, none (the model is {NOT_TRAINED})" if math.isnan(p) else
                     f"{WHERE[k]}, {what}, predicted at {p:.2f}× full depth and timed paired, as chapter 7 times "
                     f"the speeds it quotes, at "
                     f"{v:.2f}× ([{lo:.2f}, {hi:.2f}])"
                     for k, (what, p, v, lo, hi) in shown.items())


def ltt_held(risk: float | None, epsilon: float) -> str:
    """Whether the test loss at the calibrated threshold (None: none was chosen) stays within ``epsilon``."""
    return "cannot be checked" if risk is None else ("holds" if risk <= epsilon else "does not hold")


def ltt_low_role(accepted: bool) -> str:
    """What the last threshold Learn then Test looked at is."""
    return "the lowest candidate, accepted like every one before it" if accepted else \
        "the first threshold it cannot reject"


def ltt_sentence(v: dict, low_accepted: bool, delta: float) -> str:
    """What Learn then Test found, from :func:`ltt_notes`' values ``v``: how many thresholds it accepts, the chosen
    one on the test half, and where it stopped."""
    low = f"its calibration loss is {v['ltt_low_risk']:.2f} and its p-value {v['ltt_low_p']:.2g}"
    n = v["n_accepted"]
    if n == 0:
        return (f"The procedure accepts no threshold: at λ = {v['ltt_low_thr']:g}, the first it tests, {low}, not "
                f"below δ = {delta:g}, so no threshold is chosen and the test half has nothing to check.")
    count = "one threshold" if n == 1 else f"{n} thresholds"
    out = (f"The procedure accepts {count} and chooses λ = {v['ltt_lambda']}, at {v['ltt_cal_layers']:.1f} layers "
           f"per token on the calibration prompts. On the test half that threshold gives a consistency of "
           f"{v['ltt_test_cons']:.2f} ({v['ltt_test_cons_lo']:.2f} to {v['ltt_test_cons_hi']:.2f}), a loss of "
           f"{v['ltt_test_risk']:.2f}, so the bound {v['ltt_held']} there, at {v['ltt_test_layers']:.1f} layers per "
           f"token and {v['ltt_test_speed']:.2f} times the full model's speed. ")
    return out + f"The procedure stops at {v['ltt_low_thr']:g}, {ltt_low_role(low_accepted)}: {low}."


# --------------------------------------------------------------------------- every method, every model


def cache_bounds(models: dict, es, n_new: int, units: pd.DataFrame) -> pd.DataFrame:
    """The cost model's bound for each cache on each model (``models``: key -> LoadedModel): the speed of oracle
    exits with free decisions in the batch the points ran in (:func:`~earlyexit.experiments.costs.point_bounds`),
    and their consistency. Columns: model, method (the cache), speed, consistency."""
    rows = []
    for key, lm in models.items():
        full_pt = points.point(lm, es, n_new, DecodeConfig.full())
        for s in compare.FILL:
            orc = points.point(lm, es, n_new, DecodeConfig.early_exit("oracle", s))
            b = costs.point_bounds(orc, orc, full_pt, units, lm.num_layers, s)
            rows.append({"model": key, "method": s, "speed": b["oracle exits"],
                         "consistency": float(orc["rouge_full"].mean())})
    return pd.DataFrame(rows)


PARETO_FAMILIES = {"confidence rule, by cache": compare.FILL,
                   "exit classifier, by cache": compare.CLASSIFIED,
                   "schedule, bounds, self-speculation": ("SkipDecode", "static exit", "oracle exits",
                                                          "self-speculation")}


def pareto_figure(summ: pd.DataFrame, bounds: pd.DataFrame, keys, names: dict, target: float):
    """Consistency against the cost model's speed over full depth: a row per model of ``keys``, a column per
    family of :data:`PARETO_FAMILIES` (the confidence rule and the exit classifier coloured by their cache; SkipDecode,
    the bounds and self-speculation), every point of ``summ`` with its intervals on both axes, the cost model's
    bound of each cache (``bounds``, crosses, in the confidence rule's column), the ``target`` consistency (dashed)
    and full depth's speed (dotted). One x scale for every panel, logarithmic as befits a ratio (0.5× and 2× lie
    as far from 1×), so that any two points compare; a legend per column above the data."""
    import matplotlib.pyplot as plt

    figures.setup_style()
    keys = list(keys)
    fams = list(PARETO_FAMILIES.items())
    fig, axes = plt.subplots(len(keys), len(fams), figsize=(figures.FULL_WIDTH, 1.75 * len(keys) + 1.3),
                             sharex=True, sharey=True, squeeze=False, layout="constrained")
    shown = summ[summ.model.isin(keys)]
    xs = np.concatenate([shown[["speed_lo", "speed_hi"]].to_numpy(float).ravel(),
                         bounds[bounds.model.isin(keys)]["speed"].to_numpy(float), [1.0]])
    xs = xs[np.isfinite(xs) & (xs > 0)]
    pad = 1.08                                     # a ratio axis: log scale, 8% beyond the outermost point
    handles = [dict() for _ in fams]
    for r, key in enumerate(keys):
        s = shown[shown.model == key]
        for c, (title, methods) in enumerate(fams):
            ax = axes[r, c]
            for m in methods:
                g = s[s.method == m]
                if not g.empty:
                    handles[c][m.split(" / ")[-1]] = plots.method_points(ax, g.sort_values("speed"), "speed", m)
            if c == 0:
                for b in bounds[bounds.model == key].itertuples():
                    handles[c]["cost-model bound"] = ax.plot(b.speed, b.consistency, marker="x", ls="", ms=5, mew=1.2,
                                                             color=plots.CACHE_COLORS.get(b.method, "0.3"))[0]
            ax.axhline(target, color="0.5", lw=0.6, ls="--")
            ax.axvline(1.0, color="0.5", lw=0.6, ls=":")
            if r == len(keys) - 1:
                ax.set_xlabel("speed vs full depth (×, cost model)")
        axes[r, 0].set_ylabel(f"{names[key]}\nconsistency (ROUGE-L)")
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    lo, hi = float(xs.min()) / pad, float(xs.max()) * pad
    axes[0, 0].set(ylim=(0, 1.05), xscale="log", xlim=(lo, hi))
    # ticks at least about 0.12 decades apart, so that their labels never run into each other
    ticks = [t for t in (0.05, 0.1, 0.2, 0.33, 0.5, 0.67, 1.0, 1.5, 2.0, 3.0, 5.0) if lo <= t <= hi]
    for ax in axes.flat:
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticklabels([f"{t:g}" for t in ticks])
    for c, (title, _) in enumerate(fams):
        ax = axes[0, c]
        ax.set_title(title, fontsize=8)
        if handles[c]:
            ax.legend(list(handles[c].values()), list(handles[c]), loc="lower center", bbox_to_anchor=(0.5, 1.12),
                      ncols=2, fontsize=6, frameon=False, borderaxespad=0)
    return fig


def drafter_notes(summ: pd.DataFrame, dsumm: pd.DataFrame, dpts: pd.DataFrame, drafted, runs: pd.DataFrame | None = None,
                  seed: int = 0, n_boot: int = 2000, cite=None) -> dict:
    """Chapter 7's drafters next to self-speculation (``summ``: chapter 8's summary, ``dsumm``/``dpts``: the
    drafters' summary and points on the models ``drafted``): the configuration of each model that the cost model
    ranks first among the lossless ones (:func:`earlyexit.chapters.quoted.named_drafters`,
    as chapter 7 names it), with its measured speed-up as chapter 7 quotes
    it: ``cite(model, config)`` (:func:`earlyexit.chapters.quoted.paired` with chapter 7's prompts and rounds, so
    the same cached timing; ratio, lo, hi) of the ``config`` column of its rows, or without ``cite`` the mean over
    prompts of ``runs``' ``measured`` column with the bootstrap (``seed``, ``n_boot``; ``runs``: every
    self-speculative row, ``dpts`` where None); and how many prompt runs kept the full model's output."""
    runs = dpts if runs is None else runs
    fastest = quoted.named_drafters(summ, dsumm, runs)
    shown = {k: (NOT_TRAINED,) + (float("nan"),) * 4 for k in WHERE}
    for k, r in fastest[fastest.index.isin(list(drafted))].iterrows():
        g = runs[(runs.model == k) & (runs.method == r["method"]) & (runs.label == r["label"])]
        if cite is not None:
            s = cite(k, g["config"].iloc[0])
            speed = (s["ratio"], s["lo"], s["hi"])
        else:
            speed = metrics.bootstrap_ci(g["measured"].to_numpy(), n_boot, seed=seed)
        shown[k] = (f"{r['method']} ({r['label']})", float(r["speed"]), *speed)
    out = {f"draft_best{part}_{k}": x for k, row in shown.items()
           for part, x in zip(("", "_pred", "_speed", "_speed_lo", "_speed_hi"), row)}
    n, nruns = int(dpts["exact_match"].sum()), int(len(dpts))
    return out | {"draft_lossless": n, "draft_runs": nruns, "has_distill": "distill" in drafted,
                  "draft_lossless_str": lossless_phrase(n, nruns), "draft_best_str": fastest_sentence(shown)}


def table_notes(best: pd.DataFrame, keys) -> dict:
    """The summary table's facts the prose quotes, per model of ``keys`` (``best``: per model and method the
    point of :func:`~earlyexit.experiments.compare.best_at`): which methods reach the target, self-speculation's
    speed (the cost model's prediction, as every speed of the table) and layers, and each method of
    :data:`QUOTED`'s operating point (NaN and "none" where it did not run)."""
    b = best.set_index(["model", "method"])
    meets = b[b.meets]

    def bv(key, m, col):
        return float(b.loc[(key, m), col]) if (key, m) in b.index else float("nan")

    out = {}
    for key in keys:
        k = key.replace("-", "_")
        names = list(meets.loc[key].index) if key in meets.index.get_level_values(0) else []
        out |= {f"n_meet_{k}": len(names), f"names_meet_{k}": method_names(names),
                f"meet_sentence_{k}": reaching_sentence(names),
                f"spec_pred_speed_{k}": bv(key, "self-speculation", "speed"),
                f"spec_layers_{k}": bv(key, "self-speculation", "layers")}
        for m in QUOTED:
            mk = f"{k}_{m.replace(' / ', '_').replace('-', '_')}"
            ran = (key, m) in b.index
            out |= {f"{mk}_pred_speed": bv(key, m, "speed"), f"{mk}_layers": bv(key, m, "layers"),
                    f"{mk}_cons": bv(key, m, "consistency"),
                    f"{mk}_label": str(b.loc[(key, m), "label"]) if ran else "none",
                    f"{mk}_meets": reach_word(ran and bool(b.loc[(key, m), "meets"]))}
    return out


def scratch_notes(models: dict, summ: pd.DataFrame, p6, steps: int, thresholds) -> dict:
    """The from-scratch models as a control: their training ``steps``, the last layer's perplexity on chapter 6's
    held-out blocks (``p6``: its parameters), the fewest layers a token the naive mask reaches on them at the
    ``thresholds`` tried, and their depth (NaN and 0 where they are not compared)."""
    out = {"scratch_steps": int(steps), "scratch_thr_str": ", ".join(f"{t:g}" for t in thresholds),
           "scratch_thr_phrase": thresholds_phrase(thresholds)}
    for k in ("scratch-baseline", "scratch-layerskip"):
        kk = k.replace("-", "_")
        out[f"ppl_{kk}"], out[f"minlayers_{kk}"] = float("nan"), float("nan")
        if k in models:
            a = trained.layer_agreement(models[k], p6["eval_blocks"], p6["eval_seq_len"])
            out[f"ppl_{kk}"] = float(np.exp(a[a.layer == models[k].num_layers]["loss"].mean()))
            s = summ[(summ.model == k) & (summ.method == "naive-mask")]
            out[f"minlayers_{kk}"] = float(s["layers"].min()) if len(s) else float("nan")
    scratch = [k for k in models if k.startswith("scratch")]
    return out | {"L_scratch": int(models[scratch[0]].num_layers) if scratch else 0}


# --------------------------------------------------------------------------- where the error comes from


def error_splits(models: dict, es, n_new: int, P, classifiers: dict | None = None,
                 threshold: float | None = None) -> pd.DataFrame:
    """:func:`~earlyexit.experiments.compare.error_split` on each model of ``models``, with a ``model`` and a
    ``threshold`` column: the ``P["rule"]`` rule at the operating threshold (the largest threshold tried on that
    model where the operating one is not among them), or with ``classifiers`` ({model: classifier}) chapter 9's
    exit classifier at ``threshold`` with the caches it runs with."""
    frames = []
    for key, lm in models.items():
        if classifiers is None:
            tried = P["thresholds"] if key == "released" else P["trained_thresholds"]
            kw = {"rule": P["rule"], "threshold": P["operating_threshold"] if P["operating_threshold"] in tried
                  else max(tried)}
        else:
            kw = {"rule": "classifier", "threshold": threshold, "strategies": compare.CLASSIFIER_CACHES,
                  "rule_args": {"classifier": classifiers[key]}}
        split = compare.error_split(lm, es, n_new, min_layer=points.default_min_layer(P["min_layer"], lm.num_layers),
                                    seed=P["seed"], n_boot=P["n_boot"], **kw)
        frames.append(split.assign(model=key, threshold=kw["threshold"]))
    return pd.concat(frames, ignore_index=True)


def split_figure(splits: pd.DataFrame, names: dict):
    """Each method's loss split into exit decision, cache and interaction (stacked bars) with the total and its
    interval, one panel per model of ``splits``."""
    parts = {"exit_decision": "exit decision", "cache": "cache", "interaction": "interaction"}
    pc = dict(zip(parts, figures.palette(6)[3:6]))
    keys = list(dict.fromkeys(splits.model))
    fig, axes = figures.subplots(1, len(keys), width=figures.FULL_WIDTH * (0.5 * len(keys)), aspect=0.9,
                                 squeeze=False, sharey=True)
    for ax, key in zip(axes[0], keys):
        s = splits[splits.model == key]
        strats = list(dict.fromkeys(s.strategy))
        x = np.arange(len(strats))
        pos, neg = np.zeros(len(strats)), np.zeros(len(strats))
        for part, lab in parts.items():
            v = s[s.part == part].set_index("strategy").loc[strats, "mean"].to_numpy()
            ax.bar(x, v, bottom=np.where(v >= 0, pos, neg), color=pc[part], label=lab, width=0.7)
            pos, neg = pos + np.clip(v, 0, None), neg + np.clip(v, None, 0)
        t = s[s.part == "total"].set_index("strategy").loc[strats]
        ax.errorbar(x, t["mean"], yerr=[t["mean"] - t["lo"], t["hi"] - t["mean"]], fmt="o", color="black", ms=3,
                    capsize=2, lw=0.8, label="total (95% interval)")
        ax.axhline(0, color="0.3", lw=0.5)
        ax.set_xticks(x, [st.replace("-", "-\n") for st in strats], fontsize=6)
        ax.set(title=names[key], ylabel="loss: 1 - ROUGE-L vs full")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=4)
    return fig


def split_tables(splits: pd.DataFrame, names: dict):
    """:func:`split_table` as the page shows it: one table per model, one row a cache, one column a part of the
    loss (1 − ROUGE-L against the full model, mean [95% CI])."""
    t = split_table(splits, names)
    parts = {"exit_decision": "exit decision alone", "cache": "cache alone", "interaction": "interaction",
             "total": "total"}
    return plots.tables([plots.table(g.set_index("part").drop(columns="model").T.rename_axis("cache")[
        [p for p in parts if p in set(g["part"])]].rename(columns=parts), caption=f"{model}: loss, mean [95% CI]")
        for model, g in t.groupby("model", sort=False)])


def split_table(splits: pd.DataFrame, names: dict) -> pd.DataFrame:
    """The error split as a table: one row per model and part, one column per cache, "mean [lo, hi]"."""
    t = splits.assign(loss=[compare.fmt_ci(m, lo, hi) for m, lo, hi in zip(splits["mean"], splits["lo"], splits["hi"])])
    return t.assign(model=t["model"].map(names)).pivot_table(index=["model", "part"], columns="strategy",
                                                             values="loss", aggfunc="first").reset_index()


def split_notes(splits: pd.DataFrame, prefix: str, strategies) -> dict:
    """The exit-decision, cache and total loss of each model and cache of ``strategies``, as
    ``<prefix>_<model>_<cache>_<part>``."""
    sv = splits.set_index(["model", "strategy", "part"])["mean"]
    return {f"{prefix}_{key}_{s.replace('-', '_')}_{part}": float(sv.loc[(key, s, part)])
            for key in dict.fromkeys(splits.model) for s in strategies for part in ("exit_decision", "cache", "total")}


def cache_loss(splits: pd.DataFrame, model: str, strategy: str) -> float:
    """The cache part of ``strategy``'s loss on ``model`` (NaN where that model was not split)."""
    s = splits[(splits.model == model) & (splits.part == "cache") & (splits.strategy == strategy)]["mean"]
    return float(s.iloc[0]) if len(s) else float("nan")


# --------------------------------------------------------------------------- a threshold with a guarantee


def ltt_figure(det: pd.DataFrame, res: pd.DataFrame | None, lam: float | None, epsilon: float, delta: float):
    """Learn then Test on the calibration half (``det``: :func:`~earlyexit.experiments.compare.calibrate`'s
    details): (a) the loss at each threshold tested, with ``epsilon`` and the chosen ``lam``'s test loss
    (``res``); (b) the p-values with the level ``delta``."""
    fig, axes = figures.subplots(1, 2, width=figures.FULL_WIDTH * 0.8, aspect=0.75)
    xs = np.arange(len(det))
    c = figures.palette(3)
    axes[0].plot(xs, det["risk_hat"], marker="o", color=c[0], label="calibration risk")
    axes[0].axhline(epsilon, color="0.4", ls="--", lw=0.7, label="tolerance ε")
    if res is not None:
        i = int(np.flatnonzero(np.isclose(det["threshold"], lam))[0])
        r = res.iloc[0]
        axes[0].errorbar([i], [r["risk"]], yerr=[[r["risk"] - r["risk_lo"]], [r["risk_hi"] - r["risk"]]], fmt="*",
                         color=c[2], ms=8, capsize=2, label="test risk at the chosen λ")
    axes[0].set(xlabel="threshold λ (tested left to right)", ylabel="mean loss (1 - ROUGE-L)", ylim=(0, None))
    axes[1].plot(xs, det["p_value"], marker="o", color=c[1], label="p-value")
    axes[1].axhline(delta, color="0.4", ls="--", lw=0.7, label="level δ")
    axes[1].set(xlabel="threshold λ (tested left to right)", ylabel="Hoeffding-Bentkus p-value", yscale="log")
    for ax in axes:
        ax.set_xticks(xs, [f"{t:g}" for t in det["threshold"]])
        ax.legend(loc="best")
    return fig


def ltt_notes(lam: float | None, det: pd.DataFrame, res: pd.DataFrame | None, epsilon: float, delta: float) -> dict:
    """What Learn then Test found (:func:`~earlyexit.experiments.compare.calibrate`'s ``lam``, ``det``, ``res``):
    the chosen threshold, how many were accepted, the chosen one's result on the test half, the last threshold
    tested, and :func:`ltt_sentence` under ``ltt_result``."""
    acc = det["accepted"]
    out = {"ltt_lambda": "none" if lam is None else f"{lam:g}", "n_accepted": int(acc.sum()),
           "ltt_cal_layers": float(det.loc[acc, "layers"].iloc[-1]) if acc.any() else float("nan")}
    r = None if res is None else res.iloc[0]
    out |= {f"ltt_test_{k}": float("nan") if r is None else float(r[k.replace("cons", "consistency")])
            for k in ("cons", "cons_lo", "cons_hi", "layers", "speed", "risk")}
    out["ltt_held"] = ltt_held(None if r is None else float(r["risk"]), epsilon)
    low = det.iloc[-1]
    out |= {"ltt_low_thr": float(low["threshold"]), "ltt_low_risk": float(low["risk_hat"]),
            "ltt_low_p": float(low["p_value"]), "ltt_low_role": ltt_low_role(bool(low["accepted"]))}
    return out | {"ltt_result": ltt_sentence(out, bool(low["accepted"]), delta)}

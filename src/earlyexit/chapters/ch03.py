"""Chapter 3, "Copying the exit state forward": the sweep against the naive cache and its paired differences, the
attention on copies, the drift over a long generation, the cost of deciding, and every sentence whose wording
depends on a result (an amount that rounds to zero reads as "the same", never as "+0.00").
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..book import figures, plots
from ..engine import DecodeConfig
from ..experiments import metrics
from . import words

EE = DecodeConfig.early_exit
DRIFT = ["naive-mask", "copy-forward", "lazy-recompute"]   # the caches of the long generations
# the cache entries whose error panel (b) of the drift figure follows: (strategy, column of the drift rows)
ERROR_SERIES = {"copy-forward, copied entries": ("copy-forward", "k_err_copied"),
                "copy-forward, computed entries": ("copy-forward", "k_err_computed"),
                "naive-mask, computed entries": ("naive-mask", "k_err_computed")}
USELESS_ROUGE = 0.25   # below this ROUGE-L against the full model a rule's text is called useless


def colors(strategies) -> dict:
    """One colour per strategy of the sweep and for lazy recompute, shared by the chapter's figures."""
    order = [*strategies, "lazy-recompute"]
    return dict(zip(order, figures.palette(len(order))))


def _zero(x: float, digits: int) -> bool:
    """Whether ``x`` reads as zero at ``digits`` decimals."""
    return float(f"{abs(x):.{digits}f}") == 0


def _interval(lo: float, hi: float) -> str:
    return "an interval that excludes zero" if lo > 0 or hi < 0 else "an interval that includes zero"


# --------------------------------------------------------------------------- quality at equal compute


def sweep_figure(summ: pd.DataFrame, osumm: pd.DataFrame, strategies, rule: str, n_new: int, colors: dict):
    """ROUGE-L against the full model (left) and tokens until the first difference (right) against decoder layers
    per token: the rule's thresholds with each strategy (``summ``), oracle exits with each (open triangles) and
    with an exact cache (star, from ``osumm``)."""
    fig, axes = figures.subplots(1, 2, width=figures.FULL_WIDTH, aspect=0.8)
    bound = osumm[osumm.strategy == "lazy-recompute"].iloc[0]
    panels = ((axes[0], "rouge_full", "ROUGE-L vs full depth"), (axes[1], "ttd", "tokens until first divergence"))
    for ax, y, ylab in panels:
        plots.plot_tradeoff(ax, summ, "layers", y, colors=colors, labels={s: f"{rule}, {s}" for s in strategies})
        for s in strategies:
            o = osumm[osumm.strategy == s]
            ax.errorbar(o["own_layers"], o[y], yerr=[o[y] - o[f"{y}_lo"], o[f"{y}_hi"] - o[y]], fmt="^",
                        color=colors[s], mfc="white", ms=5, lw=0.8, capsize=1.5, label=f"oracle exits, {s}")
        ax.plot([bound["own_layers"]], [1.0 if y == "rouge_full" else n_new], "*", color="black", ms=7,
                label="oracle exits, exact cache")
        ax.set(xlabel="decoder layers per token", ylabel=ylab)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3)
    return fig


def paired_differences(pts: pd.DataFrame, oracle_pts: pd.DataFrame, strategies, thresholds, n_boot: int,
                       seed: int) -> pd.DataFrame:
    """The second strategy minus the first, prompt by prompt, at each threshold and under oracle exits: rows
    point ("0.9", ..., "oracle"), value (rouge_full, ttd, layers), mean, lo, hi (95% bootstrap interval)."""
    rows = []
    for t in sorted(thresholds) + ["oracle"]:
        if t == "oracle":
            a, b = (oracle_pts[oracle_pts.strategy == s].set_index("prompt") for s in strategies)
        else:
            a, b = (pts[(pts.strategy == s) & np.isclose(pts.threshold, t)].set_index("prompt") for s in strategies)
        for v in ("rouge_full", "ttd", "layers"):
            m, lo, hi = metrics.bootstrap_ci((b[v] - a[v]).to_numpy(), n_boot, seed=seed)
            rows.append({"point": str(t), "value": v, "mean": m, "lo": lo, "hi": hi})
    return pd.DataFrame(rows)


VALUES = {"rouge_full": "ROUGE-L vs full", "ttd": "tokens until the first difference", "layers": "layers / token"}


def difference_table(diff: pd.DataFrame, what: str = "copy-forward − naive-mask"):
    """:func:`paired_differences` as the chapter shows it: "+mean [+lo, +hi]", one row a point (a threshold or
    oracle exits), one column a value."""
    shown = [f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]" for m, lo, hi in zip(diff["mean"], diff["lo"], diff["hi"])]
    t = diff.assign(diff=shown).pivot(index="point", columns="value", values="diff")
    t = t.loc[list(dict.fromkeys(diff["point"])), [v for v in VALUES if v in t.columns]].rename(columns=VALUES)
    t.index = t.index.map(lambda p: "oracle exits" if p == "oracle" else f"threshold {p}")
    t.index.name, t.columns.name = f"{what}, per prompt: mean [95% CI]", None
    return plots.table(t)


def paired(diff: pd.DataFrame, point: str, value: str) -> tuple[float, float, float]:
    """(mean, lo, hi) of one paired difference, NaNs when ``point`` was not run."""
    hit = diff[(diff.point == point) & (diff.value == value)]
    if hit.empty:
        return float("nan"), float("nan"), float("nan")
    r = hit.iloc[0]
    return float(r["mean"]), float(r["lo"]), float(r["hi"])


def copy_verdict(ttd: tuple, rouge: tuple) -> str:
    """What copies buy over the naive mask under oracle exits, from the paired differences (mean, lo, hi) of
    tokens until the first divergence and of ROUGE-L; a difference that rounds to zero reads as "the same"."""
    (t, t_lo, t_hi), (r, r_lo, r_hi) = ttd, rouge
    head = "Under oracle exits, where only the cache can hurt, copies"
    t_zero, r_zero = _zero(t, 1), _zero(r, 2)
    tokens = ("the same number of tokens until the first divergence" if t_zero else
              f"{t:+.1f} tokens until the first divergence ({_interval(t_lo, t_hi)})")
    scores = "the same ROUGE-L" if r_zero else f"ROUGE-L {r:+.2f} ({_interval(r_lo, r_hi)})"
    if t_zero and r_zero:
        return f"{head} change nothing against the naive mask: {scores} and {tokens}."
    if not t_zero and t > 0 and (r_zero or r < 0):
        lost = ", which does not change" if r_zero else f" ({r:+.2f}, {_interval(r_lo, r_hi)})"
        return (f"{head} do better than the naive mask on tokens until the first divergence ({t:+.1f} tokens, "
                f"{_interval(t_lo, t_hi)}) but not on ROUGE-L{lost}.")
    if not r_zero and r > 0:
        return f"{head} beat the naive mask: {scores} and {tokens}."
    return f"{head} do no better than the naive mask: {scores}, {tokens}."


def op_rouge_sentence(threshold: float, mean: float, lo: float, hi: float) -> str:
    """What the cache changes at the rule's operating threshold (paired ROUGE-L difference, copies minus naive)."""
    if not np.isfinite(mean):
        return f"The operating threshold {threshold:g} of the confidence rule is not among the thresholds swept here."
    if _zero(mean, 2) and _zero(lo, 2) and _zero(hi, 2):
        diff = "the two caches give the same ROUGE-L"
    elif _zero(mean, 2):
        diff = f"the two caches give the same ROUGE-L on average ({lo:+.2f} to {hi:+.2f})"
    else:
        diff = f"the difference in ROUGE-L is {mean:+.2f} ({lo:+.2f} to {hi:+.2f})"
    why = ("there the rule's own wrong exits dominate (chapter 2) and the choice of cache matters little"
           if lo <= 0 <= hi else "even with the rule's own wrong exits (chapter 2) the choice of cache shows")
    return f"At the operating threshold {threshold:g} of the confidence rule {diff}: {why}."


def mass_figure(mass_s: pd.DataFrame, colors: dict):
    """The full model's attention mass per layer on the entries above the exit: holes (naive-mask) and copies
    (copy-forward), mean and 95% interval over prompts."""
    fig, ax = figures.subplots(aspect=0.6)
    for s in ["naive-mask", "copy-forward"]:
        g = mass_s[mass_s.strategy == s]
        ax.fill_between(g["layer"], g["lo"], g["hi"], alpha=0.25, lw=0, color=colors[s])
        ax.plot(g["layer"], g["mean"], marker="o", ms=2.5, color=colors[s],
                label=f"entries above the exit ({'holes' if s == 'naive-mask' else 'copies'})")
    ax.set(xlabel="layer", ylabel="full model's attention mass", ylim=(0, None))
    plots.legend_below(fig, ncols=1)
    return fig


# --------------------------------------------------------------------------- drift


def windowed(dr: pd.DataFrame, n_tokens: int) -> pd.DataFrame:
    """The drift rows of the generated tokens (t >= 1) with ``window``: the centre of their window of positions,
    eight windows over ``n_tokens``."""
    dr = dr[dr.t >= 1].copy()
    width = max(1, n_tokens // 8)
    dr["window"] = (dr["t"] - 1) // width * width + width // 2 + 1
    return dr


def error_windows(dr: pd.DataFrame) -> pd.DataFrame:
    """Each prompt's mean relative key error per window, for each series of :data:`ERROR_SERIES` (column
    ``entries``)."""
    return pd.concat([dr[dr.strategy == s].groupby(["prompt", "window"])[c].mean().rename("err").reset_index()
                      .assign(entries=name) for name, (s, c) in ERROR_SERIES.items()])


def drift_figure(kl_s: pd.DataFrame, err_s: pd.DataFrame, colors: dict):
    """(a) KL from the full model at the full-depth steps per window and cache; (b) the relative key error of
    copies and of computed entries per window (both mean and 95% interval over prompts)."""
    fig, axes = figures.subplots(1, 2, width=figures.FULL_WIDTH, aspect=0.75)
    for s in DRIFT:
        g = kl_s[kl_s.strategy == s]
        axes[0].fill_between(g["window"], g["lo"], g["hi"], alpha=0.2, lw=0, color=colors[s])
        axes[0].plot(g["window"], g["mean"], marker="o", ms=2.5, color=colors[s], label=s)
    axes[0].set_yscale("symlog", linthresh=1e-3)
    axes[0].set(xlabel="generated token t (window centre)", ylabel="KL(full || method) at full-depth steps (nats)",
                title="(a) next-token drift", ylim=(0, None))
    for name, ls in zip(ERROR_SERIES, ["-", "--", "--"]):
        g = err_s[err_s.entries == name]
        c = colors[name.split(",")[0]]
        axes[1].fill_between(g["window"], g["lo"], g["hi"], alpha=0.2, lw=0, color=c)
        axes[1].plot(g["window"], g["mean"], marker="o" if ls == "-" else "s", ms=2.5, color=c, ls=ls, label=name)
    axes[1].set(xlabel="generated token t (window centre)", ylabel="relative error of K (log scale)",
                title="(b) cache error", yscale="log")
    plots.legend_below(fig, [axes[0]], ncols=1, loc="outside lower left")    # each panel's key under it
    plots.legend_below(fig, [axes[1]], ncols=1, loc="outside lower right")
    return fig


def drift_table(dr: pd.DataFrame, L: int):
    """Per cache, over the long generations: the KL from the full model at the steps that ran all ``L`` layers
    (as the text and figure count it) and the relative error of copied and of computed keys and values ("n/a"
    where a cache makes no copies)."""
    cols = {"kl": "KL from full at full-depth steps (nats)", "k_err_copied": "rel. error of copied K",
            "v_err_copied": "rel. error of copied V", "k_err_computed": "rel. error of computed K",
            "v_err_computed": "rel. error of computed V"}
    m = dr.groupby("strategy", sort=False)[list(cols)[1:]].mean()
    m.insert(0, "kl", dr[dr["exit"] == L].groupby("strategy", sort=False)["kl"].mean())
    shown = pd.DataFrame({"cache": m.index.to_numpy(), **{name: [f"{v:.3g}" if np.isfinite(v) else "n/a" for v in m[c]]
                                                        for c, name in cols.items()}})
    return plots.table(shown)


def kl_trend(klw: pd.DataFrame, strategy: str) -> dict:
    """How the KL at full-depth steps moves with the position under ``strategy``: per prompt, the least-squares
    slope of its mean KL per window (``klw``: strategy, prompt, window, kl) against the window's centre, in nats
    per 1000 tokens; their mean over prompts with a 95% t-interval (``lo``, ``hi`` NaN under two prompts)."""
    from ..experiments.speeds import t_half_width

    slopes = []
    for _, g in klw[klw.strategy == strategy].dropna(subset=["kl"]).groupby("prompt"):
        if g["window"].nunique() >= 2:
            slopes.append(float(np.polyfit(g["window"].to_numpy(float) / 1000, g["kl"].to_numpy(float), 1)[0]))
    x = np.array(slopes)
    m = float(x.mean()) if len(x) else float("nan")
    half = t_half_width(x)
    return {"slope": m, "lo": m - half, "hi": m + half, "n": len(x)}


def trend_sentence(t: dict, n_tokens: int, what: str = "the copies' KL") -> str:
    """The trend of :func:`kl_trend` over ``n_tokens`` generated tokens in words: growth or decline only when the
    95% interval excludes 0."""
    if t["n"] < 2 or not np.isfinite(t["lo"]):
        return (f"Too few prompts ran all layers in two windows or more to say how {what} moves with the "
                f"position.")
    at = f"{t['slope']:+.2g} nats per 1000 tokens ({t['lo']:+.2g} to {t['hi']:+.2g}, 95% interval over {t['n']} prompts)"
    if t["lo"] > 0:
        return f"Over {n_tokens} generated tokens {what} grows with the position: {at}."
    if t["hi"] < 0:
        return f"Over {n_tokens} generated tokens {what} shrinks with the position: {at}."
    return (f"Over {n_tokens} generated tokens {what} shows no trend with the position: {at}, an interval that "
            f"holds 0. The distortion stays at a level set by how many entries are filled rather than growing "
            f"with the position.")


# --------------------------------------------------------------------------- the cost of deciding


def decision_schemes(P, L: int, min_layer: int, classifier: str) -> tuple[list[int], dict]:
    """The check layers of the cheap softmax check (those of ``P.check_layers`` in [min_layer, L), else
    ``min_layer``) and the six ways of deciding, {name: configuration}, all with copy-forward."""
    checks = [c for c in P.check_layers if min_layer <= c < L] or [min_layer]
    return checks, {
        "full depth": EE("full"),
        "softmax, every layer": EE("softmax", "copy-forward", min_layer=1, threshold=P.decide_threshold),
        f"softmax, layers >= {min_layer}": EE("softmax", "copy-forward", min_layer=min_layer,
                                              threshold=P.decide_threshold),
        f"softmax at {','.join(map(str, checks))}": EE("softmax", "copy-forward", min_layer=min_layer,
                                                       threshold=P.decide_threshold, check_layers=checks),
        f"saturation, layers >= {min_layer}": EE("saturation", "copy-forward", min_layer=min_layer,
                                                 threshold=P.saturation_threshold),
        f"exit classifier, layers >= {min_layer}": EE("classifier", "copy-forward", min_layer=min_layer,
                                                      threshold=P.clf_operating, classifier=classifier),
    }


def decide_figure(flm: pd.DataFrame, ts: pd.DataFrame, q: pd.DataFrame, order):
    """The schemes of ``order`` in three panels: (a) FLOPs per token over full depth split into decoder layers,
    K/V copies and head evaluations (``flm``), (b) decoding speed over full depth at batch 1, paired
    (``ts``: :func:`earlyexit.experiments.speeds.speed_table`), (c) ROUGE-L against full depth (``q``), the last
    two with 95% intervals."""
    fig, axes = figures.subplots(1, 3, width=figures.FULL_WIDTH, aspect=1.0)
    bottom = np.zeros(len(order))
    names = {"layers": "decoder layers", "kv_copies": "K/V copies", "head": "head evaluations"}
    for part, c in zip(["layers", "kv_copies", "head"], figures.palette(4)):
        vals = flm.loc[order, part].to_numpy()
        axes[0].barh(range(len(order)), vals, left=bottom, color=c, label=names[part])
        bottom += vals
    axes[0].axvline(1.0, color="0.3", lw=0.6, ls=":")
    axes[0].set(yticks=range(len(order)), yticklabels=order, xlabel="FLOPs per token / full depth", title="(a) compute")
    axes[0].invert_yaxis()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3)
    for ax, col, data, xlab, title in ((axes[1], "ratio", ts, "speed / full depth (batch 1)", "(b) speed"),
                                       (axes[2], "rouge_full", q, "ROUGE-L vs full depth", "(c) consistency")):
        m = data.loc[order, col]
        lo = data.loc[order, "lo" if col == "ratio" else f"{col}_lo"].fillna(m)
        hi = data.loc[order, "hi" if col == "ratio" else f"{col}_hi"].fillna(m)
        ax.errorbar(m, range(len(order)), xerr=[m - lo, hi - m], fmt="o", color=figures.palette(1)[0], capsize=1.5,
                    ms=3.5)
        ax.set(yticks=range(len(order)), yticklabels=[], xlabel=xlab, title=title, ylim=(len(order) - 0.5, -0.5))
    axes[1].axvline(1.0, color="0.3", lw=0.6, ls=":")
    axes[2].set_xlim(0, 1.05)
    return fig


def decide_table(q: pd.DataFrame, ts: pd.DataFrame, order):
    """Layers, head evaluations, FLOPs (over full depth), paired speed over full depth (``ts``: 95% interval)
    and ROUGE-L of each scheme of ``order``."""
    return plots.table(pd.DataFrame({"how the exit is decided": list(order),
                                     "layers / token": q.loc[order, "layers"].to_numpy(),
                                     "head evaluations / token": q.loc[order, "head_checks"].to_numpy(),
                                     "FLOPs / full depth": q.loc[order, "flop_fraction"].to_numpy(),
                                     "speed / full depth [95% CI]": [words.ratio(ts.loc[n]) for n in order],
                                     "ROUGE-L vs full": q.loc[order, "rouge_full"].to_numpy()}),
                       formats={"layers / token": "{:.1f}", "head evaluations / token": "{:.1f}"})


def speed_verdict(s) -> str:
    """How the scheme that checks the softmax at every allowed layer compares in speed with full depth, from its
    paired ratio ``s`` (:func:`earlyexit.experiments.speeds.speed`): slower or faster only when the interval
    excludes 1.0."""
    at = f"{words.ratio(s)} the speed of full depth"
    if s["verdict"] == "slower":
        return f"It is slower than not exiting at all: {at}."
    if s["verdict"] == "faster":
        return f"It is still faster than not exiting at all: {at}."
    if not words.has_interval(s):
        return f"It runs at {at}."
    return f"It runs about as fast as not exiting at all: {at}, an interval that holds 1."


def unrestricted_sentence(flops: float, layers: float, rouge: float, cheapest: bool) -> str:
    """What the softmax rule with no lower limit costs (FLOPs over full depth, layers per token; ``cheapest``:
    whether no other scheme costs fewer FLOPs) and what its text is worth (ROUGE-L against the full model)."""
    cost = (f"is the cheapest in FLOPs ({flops:.2f}) because it runs only {layers:.1f} layers per token" if cheapest
            else f"spends {flops:.2f} times the full model's FLOPs at {layers:.1f} layers per token")
    worth = f"and it is useless (ROUGE-L {rouge:.2f})" if rouge < USELESS_ROUGE else f"for a ROUGE-L of {rouge:.2f}"
    return f"The unrestricted softmax rule {cost}, {worth}."


def copies_sentence(k_err: float, v_err: float) -> str:
    """How far copy-forward's copies are from the keys and values they replace (mean relative errors), or that
    nothing was copied (no token exited early: NaN errors)."""
    import math

    if not (math.isfinite(k_err) and math.isfinite(v_err)):
        return ("No token of these generations exited early under copy-forward, so nothing was copied: there is "
                "no copy to compare.")
    how = "far from" if max(k_err, v_err) >= 0.5 else "off from" if max(k_err, v_err) >= 0.05 else "close to"
    guess = " on this model a copy is a rough guess." if how == "far from" else ""
    return (f"The copies themselves are {how} the keys and values they replace (relative error {k_err:.2f} for K, "
            f"{v_err:.2f} for V){':' + guess if guess else '.'}")

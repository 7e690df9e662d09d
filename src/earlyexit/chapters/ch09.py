"""Chapter 9, "Where the time goes": the methods it times, its figures, its tables as a reader sees them and
every sentence whose wording depends on a result. The cached computations stay in
:mod:`earlyexit.experiments` (timing, costs, frontier, points); this module only calls and arranges them."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib import ticker
from matplotlib.lines import Line2D

from ..book import figures, plots
from ..engine import DecodeConfig
from ..experiments import compare, costmodel, costs, frontier, grouped, points, speeds, timing
from . import words

EE = DecodeConfig.early_exit
CACHES = ["naive-mask", "copy-forward", "lazy-recompute"]
PARTS = list(costmodel.PARTS)
BOUND_COLS = ["measured", "predicted", "free decisions", "oracle exits"]
BATCH_METHODS = ("full depth", "classifier / lazy-recompute", "classifier / copy-forward", "SkipDecode")
FLOOR = 1e-4                                   # where an error rate of zero is drawn on the log axis


# ------------------------------------------------------------------------------------------------- unit costs
def unit_costs(units: pd.DataFrame) -> dict:
    """The measured unit costs as {(unit, size): seconds}."""
    return {(r.unit, int(r.size)): float(r.seconds) for r in units.itertuples()}


def unit_costs_figure(units: pd.DataFrame, shortlist: int):
    """(a) One decoder layer over k tokens against k one-token calls; (b) the full and the shortlist head over r
    rows, with one layer of one token for scale."""
    U = unit_costs(units)
    lay = units[units.unit == "layer"].sort_values("size")
    small = lay[lay["size"] <= 16]
    fig, axes = figures.subplots(1, 2, width=figures.FULL_WIDTH * 0.85, aspect=0.75)
    c = figures.palette(3)
    axes[0].plot(small["size"], small["seconds"] * 1e3, marker="o", color=c[0], label="one layer, k tokens")
    axes[0].plot(small["size"], small["size"] * float(small["seconds"].iloc[0]) * 1e3, ls="--", color="0.5",
                 label="k layers of one token")
    axes[0].set(xlabel="tokens k in one layer call", ylabel="time (ms)", ylim=(0, None), title="(a) a decoder layer")
    axes[0].legend(loc="upper left")
    for unit, lab, col in (("head", "full head", c[1]), ("head_short", f"shortlist head ({shortlist} rows)", c[2])):
        h = units[units.unit == unit].sort_values("size")
        axes[1].plot(h["size"], h["seconds"] * 1e3, marker="o", color=col, label=lab)
    axes[1].axhline(U[("layer", 1)] * 1e3, color="0.5", ls=":", lw=0.8, label="one layer, one token")
    rows_r = sorted(h["size"].astype(int))
    top = float(units[units.unit.isin(["head", "head_short"])]["seconds"].max()) * 1e3
    axes[1].set(xlabel="rows r", ylabel="time (ms)", xscale="log", yscale="log", title="(b) the head",
                ylim=(None, top * 6))                    # room above the lines for the key
    axes[1].set_xticks(rows_r, [str(r) for r in rows_r])
    axes[1].xaxis.set_minor_locator(ticker.NullLocator())
    axes[1].yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    axes[1].yaxis.set_minor_formatter(ticker.NullFormatter())
    axes[1].legend(loc="upper left")
    return fig


# ------------------------------------------------------------------------------------------- the timed runs
def methods(P, lm, classifier: str) -> dict:
    """The methods the chapter times at batch 1 on ``lm``: full depth, the confidence rule, saturation and the
    exit classifier (folder ``classifier``) at their operating points with each cache, and SkipDecode."""
    L, N = lm.num_layers, P.max_new_tokens
    ml = points.default_min_layer(P.min_layer, L)
    out = {"full depth": EE("full")}
    out.update({f"{P.rule} / {s}": EE(P.rule, s, min_layer=ml, threshold=P.operating_threshold) for s in CACHES})
    out["saturation / lazy-recompute"] = EE("saturation", "lazy-recompute", min_layer=ml,
                                            threshold=P.saturation_threshold)
    out.update({f"classifier / {s}": EE("classifier", s, classifier=classifier, min_layer=ml,
                                        threshold=P.clf_operating) for s in CACHES})
    e_min = compare.scale_layers([20], 30, L, 2)[0]
    return {**out, "SkipDecode": EE("skipdecode", e_max=L, e_min=e_min, horizon=N, warmup=1)}


def spec_decode_rate(sp: pd.DataFrame) -> pd.Series:
    """Decoding steps per second of each run of a :func:`earlyexit.experiments.timing.spec_point` table: n_new − 1
    steps over its time less its own prompt pass (``spec_prefill_s``, measured inside the run), as every other
    timing of this chapter counts."""
    return (sp["n_new"] - 1) / (sp["spec_s"] - sp["spec_prefill_s"]).clip(lower=1e-9)


def time_methods(P, models: dict, tset, classifiers: dict) -> pd.DataFrame:
    """Every method of :func:`methods` and self-speculation timed at batch 1 on each model (cached timings), one
    row per (model, method, prompt): tok_s (decoding steps per second, prompt pass out), calls, steps."""
    N, out = P.max_new_tokens, []
    for key, lm in models.items():
        for name, cfg in methods(P, lm, classifiers[key]).items():
            t = timing.time_point(lm, tset, N, cfg, batch=1, repeats=P.timing_repeats)
            out.append(t.assign(model=key, method=name, steps=N - 1))
        E = compare.scale_layers([P.spec_exit], 30, lm.num_layers, 1, lm.num_layers - 1)[0]
        sp = timing.spec_point(lm, tset, N, E, P.spec_draft, repeats=P.timing_repeats, peer=False)
        out.append(pd.DataFrame({"model": key, "method": f"self-spec E={E} d={P.spec_draft}", "prompt": sp["prompt"],
                                 "tok_s": spec_decode_rate(sp), "calls": sp["spec_calls"], "steps": N - 1}))
    return pd.concat(out, ignore_index=True)


# ------------------------------------------------------------------------------------------------ validation
def validation_figure(val: pd.DataFrame, error_goal: float):
    """Predicted against measured seconds of every timed run, by kind of run, with equality and ±goal lines."""
    fig, ax = figures.subplots(aspect=0.9)
    srcs = list(dict.fromkeys(val["source"]))
    for s_, col, mk in zip(srcs, figures.palette(len(srcs)), "os^Dv<>"):
        g = val[val.source == s_]
        ax.scatter(g["measured_s"], g["predicted_s"], s=10, color=col, marker=mk, label=s_, alpha=0.8, lw=0)
    both = val[["measured_s", "predicted_s"]]
    lo, hi = both.min().min() * 0.8, both.max().max() * 1.25
    ax.plot([lo, hi], [lo, hi], color="0.3", lw=0.7)
    for f_ in (1 - error_goal, 1 + error_goal):
        ax.plot([lo, hi], [lo * f_, hi * f_], color="0.6", lw=0.5, ls="--")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured time (s)",
           ylabel="predicted time (s)")
    ax.legend(loc="upper left", fontsize=6)
    return fig


def validation_notes(val: pd.DataFrame, error_goal: float) -> dict:
    """The cost model's errors as the prose quotes them: count, median, worst (and which run), verdict against
    ``error_goal`` ("within" / "outside") and the median by kind of run."""
    err = val["rel_err"].abs()
    worst = val.loc[err.idxmax()]
    by_src = val.assign(a=err).groupby("source")["a"].median()
    return {"n_val": len(val), "val_median_pct": f"{err.median():.0%}", "val_worst_pct": f"{err.max():.0%}",
            "val_worst_what": f"{worst['method']} ({worst['source']})",
            "val_verdict": "within" if err.median() < error_goal else "outside",
            "val_by_source": "; ".join(f"{k} {v:.0%}" for k, v in by_src.items())}


# ------------------------------------------------------------------------------------------------- breakdown
def breakdown_table(timed: pd.DataFrame, units: pd.DataFrame) -> pd.DataFrame:
    """Per (model, method), in the timed order: the cost model's seconds per decoding step split into
    :data:`PARTS` (:func:`earlyexit.experiments.costs.breakdown`, averaged over prompts) and the measured seconds
    per step."""
    rows = []
    for (key, name), g in timed.groupby(["model", "method"], sort=False):
        parts = dict.fromkeys(PARTS, 0.0)
        for r in g.itertuples():
            c = costs.breakdown(r.calls, units, per=r.steps)
            for p_ in PARTS:
                parts[p_] += c[p_] / len(g)
        rows.append({"model": key, "method": name, **parts, "measured": float((1 / g["tok_s"]).mean())})
    return pd.DataFrame(rows)


def breakdown_figure(bd: pd.DataFrame, names: dict):
    """One panel per model: each method's predicted step as stacked parts, its measured time as a black mark."""
    keys = list(dict.fromkeys(bd["model"]))
    pc = dict(zip(PARTS, figures.palette(len(PARTS))))
    fig, axes = figures.subplots(1, len(keys), width=figures.FULL_WIDTH, aspect=0.9 * len(keys), squeeze=False,
                                 sharex=True)
    for ax, key in zip(axes[0], keys):
        b = bd[bd.model == key]
        y = np.arange(len(b))
        left = np.zeros(len(b))
        for p_ in PARTS:
            ax.barh(y, b[p_] * 1e3, left=left, color=pc[p_], label=p_, height=0.7)
            left += b[p_].to_numpy() * 1e3
        ax.plot(b["measured"] * 1e3, y, "k|", ms=9, mew=1.5, label="measured")
        ax.set(yticks=y, yticklabels=b["method"], ylim=(len(b) - 0.5, -0.5), xlabel="ms per generated token",
               title=names[key].replace(" + ", "\n+ "))          # two lines: the long name overran the figure
        ax.tick_params(axis="y", labelsize=6)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=4)
    return fig


# ------------------------------------------------------------------------------------------------ classifier
def quality_figure(qual: pd.DataFrame, names: dict, clf_operating: float):
    """The exit classifier per layer on each model: (a) AUC; (b) precision at the operating threshold and the
    share of positions whose exit keeps the token."""
    fig, axes = figures.subplots(1, 2, width=figures.FULL_WIDTH * 0.85, aspect=0.75)
    keys = list(dict.fromkeys(qual["model"]))
    for key, col in zip(keys, figures.palette(len(keys))):
        q = qual[qual.model == key]
        axes[0].plot(q["layer"], q["auc"], marker="o", ms=2.5, color=col, label=names[key])
        axes[1].plot(q["layer"], q["precision"], marker="o", ms=2.5, color=col, label=f"precision, {names[key]}")
        axes[1].plot(q["layer"], q["positives"], ls=":", color=col, label=f"share keeping the token, {names[key]}")
    axes[0].axhline(0.5, color="0.6", lw=0.6, ls="--")
    axes[0].set(xlabel="exit after layer", ylabel="AUC", ylim=(0.4, 1.0), title="(a) ranking")
    axes[1].set(xlabel="exit after layer", ylabel="share", ylim=(0, 1.02), title=f"(b) at threshold {clf_operating:g}")
    plots.legend_below(fig, [axes[0]], ncols=1, loc="outside lower left")     # each panel's key under it
    plots.legend_below(fig, [axes[1]], ncols=1, loc="outside lower right")
    return fig


def operating_points(sw: pd.DataFrame, speed: pd.Series, clf_operating: float) -> pd.DataFrame:
    """The summary rows of the sweep at the operating points (the classifier at ``clf_operating``, every other
    rule as swept), with method ("rule / strategy") and speed: the timed speed relative to full depth."""
    sw = sw.assign(method=sw["rule"] + " / " + sw["strategy"])
    thr = sw.label.str.extract(r" ([0-9.]+) /")[0].astype(float)
    op = sw[((sw.rule == "classifier") & np.isclose(thr, clf_operating)) | (sw.rule != "classifier")].copy()
    full = {m_: speed.loc[(m_, "full depth")] for m_ in op["model"].unique()}
    op["speed"] = [speed.get((m_, me), np.nan) / full[m_] for m_, me in zip(op["model"], op["method"])]
    return op


def operating_table(op: pd.DataFrame, names: dict, ci) -> pd.DataFrame:
    """The operating points as the page shows them: consistency, layers per token (95% intervals), speed."""
    return pd.DataFrame({
        "model": op["model"].map(names), "method": op["label"],
        "consistency [95% CI]": [ci(r, "rouge_full") for _, r in op.iterrows()],
        "layers / token [95% CI]": [ci(r, "layers", "{:.1f}") for _, r in op.iterrows()],
        "speed vs full (batch 1)": op["speed"].map(lambda v: f"{v:.2f}"),
    }).reset_index(drop=True)


def best_consistent(op: pd.DataFrame, floor: float):
    """The fastest operating point other than full depth with consistency at least ``floor``, or None."""
    ok = op[(op.rouge_full >= floor) & (op.rule != "full")]
    return ok.sort_values("speed", ascending=False).iloc[0] if len(ok) else None


def pays_sentence(op: pd.DataFrame, floor: float, names: dict) -> str:
    """Where early exit pays at batch one: the fastest method consistent enough, else the most consistent."""
    best = best_consistent(op, floor)
    if best is not None:
        return (f"At batch one on this machine, the fastest token-level method that keeps a consistency of at least "
                f"{floor:g} is {best['label']} on {names[best['model']]}, at {best['speed']:.2f} times full "
                f"depth (consistency {best['rouge_full']:.2f}).")
    most = op[op.rule != "full"].sort_values("rouge_full", ascending=False).iloc[0]
    return (f"At batch one on this machine, no token-level method keeps a consistency of {floor:g}: "
            f"the most consistent, {most['label']} on {names[most['model']]}, keeps {most['rouge_full']:.2f} at "
            f"{most['speed']:.2f} times full depth.")


# ---------------------------------------------------------------------------------------- Learn then Test
def ltt_lambda(lam) -> str:
    """The chosen threshold as "λ = x", or "no threshold"."""
    return "no threshold" if lam is None else f"λ = {lam:g}"


def ltt_sentence(n_accepted: int, lam) -> str:
    """What Learn then Test accepted and chose (``lam``: the lowest accepted threshold, None if none)."""
    if not n_accepted or lam is None:
        return "The test accepts no threshold, so none is chosen."
    if n_accepted == 1:
        return f"The test accepts one threshold, {ltt_lambda(lam)}."
    return f"The test accepts {n_accepted} thresholds and chooses the lowest, {ltt_lambda(lam)}."


def ltt_result(res, epsilon: float) -> str:
    """The chosen threshold on the test half (``res``: its one-row summary, None if nothing was chosen)."""
    if res is None:
        return "Nothing is left to test on the test half."
    r = res.iloc[0]
    return (f"On the test half it keeps a consistency of {r['consistency']:.2f} "
            f"({r['consistency_lo']:.2f} to {r['consistency_hi']:.2f}), a loss of {r['risk']:.2f} "
            f"({'within' if r['risk'] <= epsilon else 'above'} ε), at {r['layers']:.1f} layers per token.")


# ---------------------------------------------------------------------------------------------------- bounds
def bounds_table(P, models: dict, tset, timed: pd.DataFrame, speed: pd.Series, units: pd.DataFrame) -> pd.DataFrame:
    """The confidence rule with each cache on each model, as speed relative to full depth at batch 1: measured,
    predicted, predicted with free decisions and with oracle exits (the cached oracle points' exits replayed)."""
    rows = []
    for key, lm in models.items():
        full_t = costs.seconds_per_token(timed[(timed.model == key) & (timed.method == "full depth")], units)
        for s in CACHES:
            g = timed[(timed.model == key) & (timed.method == f"{P.rule} / {s}")]
            orc = points.point(lm, tset, P.max_new_tokens, EE("oracle", s))
            rep = costs.replay_calls(lm, tset, P.max_new_tokens, orc, s)
            rows.append({"model": key, "cache": s,
                         "measured": speeds.speed(g)["ratio"],  # paired with full depth, prompt by prompt
                         "predicted": full_t / costs.seconds_per_token(g, units),
                         "free decisions": full_t / costs.seconds_per_token(g, units, free_decisions=True),
                         "oracle exits": full_t / costs.seconds_per_token(rep, units)})
    return pd.DataFrame(rows)


def bounds_figure(bounds: pd.DataFrame, names: dict, speed_goal: float):
    """One panel per model: the four speeds of :func:`bounds_table` per cache, full depth and the target."""
    keys = list(dict.fromkeys(bounds["model"]))
    fig, axes = figures.subplots(1, len(keys), width=figures.FULL_WIDTH * 0.9, aspect=0.7 * len(keys), squeeze=False,
                                 sharey=True)
    bc = dict(zip(BOUND_COLS, figures.palette(len(BOUND_COLS))))
    for ax, key in zip(axes[0], keys):
        b = bounds[bounds.model == key]
        x = np.arange(len(b))
        for i, c_ in enumerate(BOUND_COLS):
            ax.bar(x + (i - 1.5) * 0.2, b[c_], width=0.2, color=bc[c_], label=c_)
        ax.axhline(1.0, color="0.3", lw=0.6)
        ax.axhline(speed_goal, color="0.5", lw=0.6, ls="--")
        ax.set(xticks=x, xticklabels=[c.replace("-", "-\n") for c in b["cache"]], title=names[key])
        ax.tick_params(axis="x", labelsize=6)
    axes[0, 0].set_ylabel("speed vs full depth (batch 1)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=4)
    return fig


def bounds_notes(bounds: pd.DataFrame, names: dict, speed_goal: float) -> dict:
    """The best oracle bound of all, where it is, and whether it "reaches" or "stays below" ``speed_goal``."""
    top = bounds.sort_values("oracle exits", ascending=False).iloc[0]
    return {"bound_best": f"{top['cache']} on {names[top['model']]}", "bound_best_speed": float(top["oracle exits"]),
            "bound_verdict": "reaches" if top["oracle exits"] >= speed_goal else "stays below"}


# -------------------------------------------------------------------------------------------------- frontier
def frontier_figure(front: pd.DataFrame, names: dict, floor: float, eps: float):
    """(a) wrong exits per token against the mean exit; (b) identical prefix against the cost model's speed; per
    rule (colour) and model (marker, line), the oracle as stars."""
    rules = frontier.RULES
    keys = list(dict.fromkeys(front["model"]))
    fig, axes = figures.subplots(1, 2, width=figures.FULL_WIDTH, aspect=0.8)
    rc = dict(zip(rules, figures.palette(len(rules))))
    styles = dict(zip(keys, [("o", "-", "full"), ("s", "--", "none")]))
    for key in keys:
        mk, ls, fill = styles[key]
        for rule_ in rules:
            g = front[(front.model == key) & (front.rule == rule_)].sort_values("threshold")
            lab = f"{rule_}, {names[key]}"
            axes[0].plot(g["mean_exit"], g["error_rate"].clip(lower=FLOOR), marker=mk, ms=3, ls=ls, color=rc[rule_],
                         label=lab)
            axes[1].plot(g["prefix"], g["speed"], marker=mk, ms=3, ls=ls, color=rc[rule_], label=lab)
        o = front[(front.model == key) & (front.rule == "oracle")].iloc[0]
        axes[0].plot([o["mean_exit"]], [FLOOR], marker="*", ms=9, color="k", ls="none", fillstyle=fill)
        axes[1].plot([1.0], [o["speed"]], marker="*", ms=9, color="k", ls="none", fillstyle=fill)
    axes[0].axhline(eps, color="0.4", lw=0.7, ls=":")
    axes[0].set(yscale="log", xlabel="mean exit (layers run per token)", ylabel="wrong exits per token",
                title="(a) depth against error", ylim=(FLOOR * 0.7, 1))
    axes[1].axvline(floor, color="0.4", lw=0.7, ls=":")
    axes[1].axhline(1.0, color="0.3", lw=0.6)
    axes[1].set(xlabel="identical prefix (share of the output)", ylabel="speed vs full depth (cost model)",
                title="(b) consistency against speed", xlim=(0, 1.03))
    key_ = [Line2D([], [], color=rc[r_], label=r_) for r_ in rules]     # a short key: colour rule, line model
    key_ += [Line2D([], [], color="0.4", marker=styles[k][0], ms=3, ls=styles[k][1], label=names[k]) for k in keys]
    key_ += [Line2D([], [], color="k", marker="*", ms=9, ls="none", fillstyle=styles[k][2], label=f"oracle, {names[k]}")
             for k in keys]
    fig.legend(handles=key_, loc="outside lower center", ncols=4)
    return fig


def frontier_best(fk: pd.DataFrame, L: int, floor: float) -> str:
    """What the replayed thresholds ``fk`` (one model, no oracle) of an ``L``-layer model offer at an identical
    prefix of ``floor``: the fastest that exits at all (and the rule that keeps it only without exiting), or the
    fastest of those that hardly exit, or, if none keeps it, the closest."""
    okf = fk[fk.prefix >= floor].sort_values("speed", ascending=False)
    moves = okf.mean_exit < L - 0.1                      # thresholds that save at least a tenth of a layer a token
    exiting, idle = okf[moves], okf[~moves]
    if len(exiting):
        b_ = exiting.iloc[0]
        s = (f"the fastest threshold that keeps an identical prefix of at least {floor:g} and "
             f"exits at all is {b_['rule']} at {b_['threshold']:g}: it is wrong on {b_['error_rate']:.1%} of "
             f"tokens, exits after {b_['mean_exit']:.1f} layers on average and runs at {b_['speed']:.2f} times "
             f"full depth ({b_['speed_free']:.2f} if its decisions were free).")
        if len(idle):
            i_ = idle.iloc[0]
            s += (f" {i_['rule'].capitalize()} keeps it only at thresholds where it hardly ever exits (at "
                  f"{i_['threshold']:g}: {i_['mean_exit']:.2f} layers on average, {i_['speed']:.2f} times full "
                  f"depth: its checks cost time and save none).")
        return s
    if len(okf):
        b_ = okf.iloc[0]
        return (f"only thresholds that hardly ever exit keep an identical prefix of {floor:g}: the "
                f"fastest, {b_['rule']} at {b_['threshold']:g}, exits after {b_['mean_exit']:.2f} layers on average "
                f"and runs at {b_['speed']:.2f} times full depth.")
    b_ = fk.sort_values(["prefix", "speed"], ascending=False).iloc[0]
    return (f"no threshold keeps an identical prefix of {floor:g}; the closest, {b_['rule']} at "
            f"{b_['threshold']:g}, keeps {b_['prefix']:.2f}, is wrong on {b_['error_rate']:.1%} of tokens, exits "
            f"after {b_['mean_exit']:.1f} layers on average and runs at {b_['speed']:.2f} times full depth.")


def frontier_verdict(fk: pd.DataFrame, floor: float) -> str:
    """Whether the fastest threshold consistent enough is "faster" or "not faster" than full depth."""
    okf = fk[fk.prefix >= floor].sort_values("speed", ascending=False)
    return "faster" if len(okf) and okf.iloc[0]["speed"] > 1 else "not faster"


def frontier_notes(front: pd.DataFrame, key: str, L: int, floor: float) -> dict:
    """The frontier of model ``key`` (``L`` layers) as the prose quotes it: the oracle, the fastest threshold,
    :func:`frontier_best` and :func:`frontier_verdict`."""
    fk = front[(front.model == key) & (front.rule != "oracle")]
    of = front[(front.model == key) & (front.rule == "oracle")].iloc[0]
    fast = fk.sort_values("speed", ascending=False).iloc[0]
    return {"fr_oracle_exit": float(of["mean_exit"]), "fr_oracle_speed": float(of["speed"]),
            "fr_fast": f"{fast['rule']} at {fast['threshold']:g}", "fr_fast_speed": float(fast["speed"]),
            "fr_fast_prefix": float(fast["prefix"]), "fr_fast_err": float(fast["error_rate"]),
            "fr_best": frontier_best(fk, L, floor), "fr_verdict": frontier_verdict(fk, floor)}


# --------------------------------------------------------------------------------------------- where it pays
def batch_table(P, lm, es, tset, classifier: str) -> pd.DataFrame:
    """:data:`BATCH_METHODS` at each batch size of ``P.batch_sizes`` (cached timings; batch 1 on the timed prompts
    ``tset``, a larger batch on ``P.batch_groups`` disjoint groups of prompts: :mod:`earlyexit.experiments.grouped`):
    tok_s, and the paired speed over full depth at the same batch (:func:`earlyexit.experiments.speeds.speed`:
    ratio, lo, hi, verdict, digits; ``speed vs full`` = ratio; ``speed / full depth [95% CI]`` in words)."""
    ms = methods(P, lm, classifier)
    rows = []
    for B, sub in grouped.batch_sets(lm, es, P.batch_sizes, P.batch_groups, tset).items():
        for name in BATCH_METHODS:
            t = grouped.time_groups(lm, sub, P.max_new_tokens, ms[name], batch=B, repeats=P.timing_repeats)
            rows.append({"batch": B, "method": name, "tok_s": float(t["tok_s"].mean()), **speeds.speed(t)})
    bt = pd.DataFrame(rows)
    bt["speed vs full"] = bt["ratio"]
    bt["speed / full depth [95% CI]"] = [words.ratio(r) for _, r in bt.iterrows()]
    return bt


def exit_needed(U: dict, L: int, speed_goal: float) -> dict:
    """What the exits would have to be for ``speed_goal`` with free decisions (a step costs e·C(1) + head +
    overhead): the mean exit needed, the head's share of a full-depth step, and the speed-up of a step that
    ran no layer at all."""
    c1, head, over = U[("layer", 1)], U[("head", 1)], U[("step", 1)]
    full_t = L * c1 + head + over
    return {"need_exit": float((full_t / speed_goal - head - over) / c1), "head_share": head / full_t,
            "ceiling_no_layers": 1 / (head / full_t + over / full_t)}


def verdict(best, names: dict, speed_goal: float, floor: float, oracle_model: str, oracle_speed: float) -> str:
    """The chapter's answer: the fastest method consistent enough (``best``, a row of the operating points) and
    whether it meets the target, or, with none, that the right exits exist (oracle exits on ``oracle_model`` at
    ``oracle_speed``) but no rule finds them."""
    if best is None:
        return (f"No token-level method keeps a consistency of {floor:g} and beats full depth here: the exits "
                f"that keep the token are there (oracle exits on {oracle_model}: {oracle_speed:.2f} times full "
                f"depth), but no exit rule tells them from the wrong ones early enough.")
    how = ("it meets" if best["speed"] >= speed_goal else
           "faster than full depth, short of" if best["speed"] > 1 else "slower than full depth and short of")
    return (f"On this machine, at batch one, {best['label']} on {names[best['model']]} decodes at "
            f"{best['speed']:.2f} times full depth at consistency {best['rouge_full']:.2f}: {how} the "
            f"{speed_goal:g}× target.")

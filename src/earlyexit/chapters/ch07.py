"""Chapter 7, self-speculative decoding, as its page shows it: the figures (each function returns one), the tables,
and the sentences whose wording depends on a result (the ``*_notes`` functions return {glue key: value})."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..book import figures, plots
from ..experiments import budget, compare, costmodel, points, trained
from ..experiments.metrics import ci
from . import quoted
from .words import count, listing as _and, sig1  # noqa: F401 (sig1: chapter 7's API)
from .budget_words import (SPEED_GOAL, TOO_FAR, _run, break_even_sentence,  # noqa: F401 (chapter 7's API)
                           ceil_reason, need_phrase, need_sentence, one_caveat, training_needed)
from .second_peer import economize_notes, economize_table, same_drafter_note  # noqa: F401 (chapter 7's API)

PEER_GOAL = 1.3                     # issue 5: speed-up over transformers' peer (SPEED_GOAL: over full depth)
MODELS = ("released", "trained")


def model_colors() -> dict:
    """One colour per model, the same in every figure of the chapter."""
    return dict(zip(MODELS, figures.palette(2)))


def _yerr(df: pd.DataFrame, v: str) -> list:
    return [df[v] - df[f"{v}_lo"], df[f"{v}_hi"] - df[v]]


def acceptance_figure(gs: pd.DataFrame, acc: pd.DataFrame, drafts):
    """Per layer, how often its exit agrees with the full model (``gs``: released and trained, 95% bands), and
    the acceptance measured at each (E, d) (``acc``: markers)."""
    mc = model_colors()
    dc = dict(zip(drafts, figures.palette(len(drafts) + 2)[2:]))
    fig, ax = figures.subplots(aspect=0.6)
    for m in MODELS:
        g = gs[gs.model == m]
        ax.fill_between(g["layer"], g["lo"], g["hi"], color=mc[m], alpha=0.25, lw=0)
        ax.plot(g["layer"], g["mean"], color=mc[m], lw=1.2, label=f"{m}: one-token agreement")
    for d, mk in zip(drafts, "sDv^<>"):
        a = acc[acc.d == d]
        ax.errorbar(a["E"], a["acceptance"], yerr=_yerr(a, "acceptance"), fmt=mk, color=dc[d], ms=4, capsize=1.5,
                    lw=0.8, label=f"trained: measured acceptance, d = {d}")
    ax.set(xlabel="draft depth E (layers)", ylabel="fraction of drafts accepted", ylim=(0, 1.02))
    ax.legend(loc="upper left", fontsize=6)
    return fig


def speed_map(sp: pd.DataFrame, exits, drafts, peer: bool):
    """Heat maps over (E, d) of the speed-up over full depth and, with ``peer``, of ours against transformers'
    assistant_early_exit (log2 colour scale, the ratio written in each cell)."""
    ncol = 2 if peer else 1
    fig, axes = figures.subplots(1, ncol, width=figures.FULL_WIDTH * (0.8 if ncol == 2 else 0.45), aspect=0.8,
                                 squeeze=False)
    panels = [("speedup", "(a) speed-up over full depth")] + ([("vs_hf", "(b) ours vs transformers")] if peer else [])
    for ax, (col, title) in zip(axes[0], panels):
        m = sp.pivot(index="E", columns="d", values=col).loc[exits, drafts]
        lim = max(abs(np.log2(m.to_numpy())).max(), 0.2)
        im = ax.imshow(np.log2(m.to_numpy()), cmap="PuOr", vmin=-lim, vmax=lim, aspect="auto", origin="lower")
        for i, E in enumerate(exits):
            for j, d in enumerate(drafts):
                ax.text(j, i, f"{m.loc[E, d]:.2f}×", ha="center", va="center", fontsize=7,
                        color="white" if abs(np.log2(m.loc[E, d])) > 0.55 * lim else "black")
        ax.set_xticks(range(len(drafts)), drafts)
        ax.set_yticks(range(len(exits)), exits)
        ax.set(xlabel="draft length d (tokens)", ylabel="draft depth E (layers)", title=title)
        fig.colorbar(im, ax=ax, shrink=0.8).set_label("speed ratio (log2 colour scale)")
    return fig


def meets(x: float, goal: float, lo: float | None = None, hi: float | None = None) -> str:
    """Whether ``x`` reaches ``goal``, as the verb the page prints ("which … the 1.3× goal"). With a 95% interval
    (``lo``, ``hi``) the verdict is the interval's: "meets" only when all of it reaches the goal, "misses" only
    when none of it does, and otherwise that neither is clear, so that two timings of one configuration whose
    intervals both hold the goal cannot print opposite verdicts."""
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return "meets" if x >= goal else "misses"
    if lo >= goal:
        return "meets"
    if hi < goal:
        return "misses"
    return "neither clearly meets nor clearly misses"


def spec_verdict(speedup: float, lo: float, hi: float, goal: float = SPEED_GOAL) -> str:
    """What the best point's speed-up (95% interval ``lo`` to ``hi``) says of self-speculation on this machine:
    slower or faster only when the interval excludes 1.0."""
    if hi < 1:
        return "still leaves self-speculation slower than full depth"
    if lo <= 1:
        return "leaves self-speculation no measurably faster than full depth"
    return "gives a speed-up, but a modest one" if speedup < goal else "gives the speed-up the method promises"


def speed_notes(best: pd.Series, grid: pd.DataFrame, sp: pd.DataFrame, eng_hf: pd.DataFrame | None,
                head_layers: float) -> dict:
    """The fastest point (``best``, a row of the speed summary ``sp``) against full depth and against
    transformers' assistant_early_exit, and how much of the latter is the engine (``eng_hf``: our full depth
    against transformers' plain generate; None when the peer was not timed)."""
    bg = grid[(grid.E == int(best["E"])) & (grid.d == int(best["d"]))]
    out = {f"best_{k}": float(best[v]) for k, v in (("speedup", "speedup"), ("speedup_lo", "speedup_lo"),
           ("speedup_hi", "speedup_hi"), ("acc", "acceptance"), ("layers", "layers"), ("tpr", "tokens_per_round"))}
    out.update({"best_E": int(best["E"]), "best_d": int(best["d"]), "n_lossless": int(grid["lossless"].sum()),
                "n_runs": int(len(grid)), "speed_goal_x": SPEED_GOAL, "peer_goal_x": PEER_GOAL,
                "speed_goal_verb": meets(best["speedup"], SPEED_GOAL, best["speedup_lo"], best["speedup_hi"]),
                "spec_verdict": spec_verdict(best["speedup"], best["speedup_lo"], best["speedup_hi"]),
                "full_tps": float(bg["full_tok_s"].mean()), "spec_tps": float(bg["spec_tok_s"].mean()),
                "head_layers": head_layers})
    if eng_hf is None:
        return {**out, "hf_goal": "was not measured against", **dict.fromkeys((
            "hf_lossless", "best_vs_hf", "best_vs_hf_lo", "best_vs_hf_hi", "vs_hf_min", "vs_hf_max", "hf_tps",
            "engine_vs_hf", "method_vs_hf", "hf_gen_lossless"), float("nan"))}
    engine = float((eng_hf["seconds"] / eng_hf["full_s"]).mean())
    return {**out, "hf_lossless": int(grid["hf_lossless"].astype(bool).sum()), "best_vs_hf": float(best["vs_hf"]),
            "best_vs_hf_lo": float(best["vs_hf_lo"]), "best_vs_hf_hi": float(best["vs_hf_hi"]),
            "vs_hf_min": float(sp["vs_hf"].min()), "vs_hf_max": float(sp["vs_hf"].max()),
            "hf_goal": meets(best["vs_hf"], PEER_GOAL, best["vs_hf_lo"], best["vs_hf_hi"]),
            "hf_tps": float(bg["hf_tok_s"].mean()),
            "engine_vs_hf": engine, "method_vs_hf": float(best["vs_hf"]) / engine,
            "hf_gen_lossless": int(eng_hf["lossless"].sum())}


def shortlist_notes(lm, K: int, full: pd.DataFrame) -> dict:
    """The share of the training stream and of the greedy tokens of ``full`` that the shortlist of ``K`` covers."""
    from ..corpus import token_counts
    from ..engine.adapter import adapter
    from ..engine.speculative import shortlist_ids

    short = set(shortlist_ids(lm, adapter(lm), K).tolist())
    tc = token_counts(lm.tokenizer)
    toks = [t for s in full["tokens"] for t in points.split_ints(s)]
    return {"short_cover_stream": float(tc[sorted(short)].sum() / tc.sum()),
            "short_cover_full": float(np.mean([t in short for t in toks]))}


def variants_table(vs: pd.DataFrame, vr: pd.DataFrame):
    """The four drafts as the page shows them."""
    return pd.DataFrame({"draft": list(vs.index),
                         "speed-up over full depth [95% CI]": [ci(vs.loc[n], "speedup") for n in vs.index],
                         "acceptance": [f"{vs.loc[n, 'acceptance']:.0%}" for n in vs.index],
                         "tokens per round": [f"{vs.loc[n, 'tokens_per_round']:.2f}" for n in vs.index],
                         "lossless": [f"{int(vr[vr.variant == n]['lossless'].sum())}/{int((vr.variant == n).sum())}"
                                      for n in vs.index]}).style.hide(axis="index")


def budget_figure(acc_t, at, ext, need, exits, runs, shortlist: bool):
    """Per draft depth, the acceptance along each continual run (``at``) with its fitted line extended (``ext``),
    the released model's, and the acceptance a round needs for 1.0× and :data:`SPEED_GOAL` (``need``)."""
    pal = figures.palette(10)  # blue, orange, green, then purple and brown: the vermilion reads too close to the orange
    rc = {k: pal[i] for k, i in zip(runs, (0, 1, 2, 4, 5, 6, 7))}
    fig, axes = figures.subplots(1, len(exits), width=figures.FULL_WIDTH, aspect=0.85, squeeze=False, sharey=True)
    t_max = float(acc_t["tokens"].max())
    for ax, E in zip(axes[0], exits):
        ax.axhline(float(acc_t[(acc_t.step == 0) & (acc_t.layer == E)]["agreement"].mean()), color="0.4", lw=0.8,
                   ls=":", label="released (no training)")
        for k in runs:
            g = at[(at.recipe == k) & (at.layer == E)]
            ax.fill_between(g["tokens"], g["lo"], g["hi"], color=rc[k], alpha=0.2, lw=0)
            ax.plot(g["tokens"], g["mean"], marker="o", ms=3, color=rc[k], label=trained.RUN_NAMES.get(k, k))
            f = ext[(ext.recipe == k) & (ext.E == E)].iloc[0]
            xs = np.geomspace(max(g["tokens"].min(), 1), t_max * 1e4, 50)
            ax.plot(xs, budget.predict_alpha({"a": f.a, "b": f.b}, xs), color=rc[k], lw=0.8, ls="--")
        n = need[(need.E == E) & (need.shortlist == shortlist)]
        for tgt, ls in ((1.0, "-"), (SPEED_GOAL, "-.")):
            a = n[n.target == tgt]["alpha"].min()
            if np.isfinite(a):
                ax.axhline(a, color="k", lw=0.9, ls=ls, label=f"needed for {tgt:.1f}x (cheapest d)")
        ax.set(xscale="log", xlabel="training tokens", title=f"E = {E}", ylim=(0, 1.02))
    axes[0][0].set(ylabel="acceptance of a one-token draft")
    hl = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            hl.setdefault(lab, h)
    fig.legend(hl.values(), hl.keys(), loc="outside lower center", ncol=3, fontsize=6, frameon=False)
    return fig


def ceiling(L: int, exits, drafts, units, shortlist: bool) -> tuple[float, int, int]:
    """(speed-up, E, d) of the fastest round swept if every draft were accepted."""
    return max((float(budget.speedup(1.0, L, E, d, units, shortlist)), E, d) for E in exits for d in drafts)


def budget_notes(acc_t, need, ext, units, L: int, exits, drafts, best: tuple, shortlist: bool,
                 s_step: float, tok_step: float) -> dict:
    """The budget section's numbers and sentences: acceptance needed at the ``best`` (E, d) and reached, the
    ceiling, and what break-even and :data:`SPEED_GOAL` would take in training."""
    t_max = float(acc_t["tokens"].max())
    ceil = ceiling(L, exits, drafts, units, shortlist)
    e = ext[(ext.shortlist == shortlist) & (ext.recipe == "layerskip") & (ext.E == best[0]) & (ext.d == best[1])]
    be = e[e.target == 1.0].iloc[0]
    out = {"n_snap": int(acc_t[acc_t.step > 0][["recipe", "step"]].drop_duplicates().groupby("recipe").size().max()),
           "budget_tokens": int(t_max), "be_x": 1.0, "train_s_step": s_step, "be_need_best": float(be.alpha_needed),
           "be_now_best": float(be.alpha_now), "ceil_reason": ceil_reason(ceil),
           "be_best_str": break_even_sentence(float(be.alpha_needed), float(be.alpha_now), best)}
    for k, tgt in (("be", 1.0), ("goal", SPEED_GOAL)):
        out[f"need_{k}_str"] = need_sentence(need[(need.shortlist == shortlist) & (need.target == tgt)],
                                             tgt if k == "goal" else None)
        out[f"x_{k}_str"] = training_needed(ext[(ext.shortlist == shortlist) & (ext.target == tgt)], t_max,
                                            tok_step, s_step, ceil)
    out["x_be_str"], out["x_goal_str"] = one_caveat(out["x_be_str"], out["x_goal_str"])
    return out


def budget_table(ext, units, L: int, runs, shortlist: bool):
    """Per (E, d): the speed-up if every draft were accepted, the acceptance break-even and the speed goal
    need ("out of reach": not even at acceptance 1), and for each run its acceptance now and the training tokens
    its fitted line needs to break even."""
    rows = []
    mine = ext[ext.shortlist == shortlist]
    goal = mine[mine.target == SPEED_GOAL].groupby(["E", "d"])["alpha_needed"].first()
    for (E, d), g in mine[mine.target == 1.0].groupby(["E", "d"]):
        a, b = g["alpha_needed"].iloc[0], goal.get((E, d), np.nan)
        r = {"draft": f"E = {int(E)}, d = {int(d)}",
             "speed-up if every draft is accepted": f"{float(budget.speedup(1.0, L, int(E), int(d), units, shortlist)):.2f}x",
             "acceptance needed for 1.0x": f"{a:.2f}" if np.isfinite(a) else "out of reach",
             f"acceptance needed for {SPEED_GOAL:g}x": f"{b:.2f}" if np.isfinite(b) else "out of reach"}
        for k in runs:
            x = g[g.recipe == k].iloc[0]
            t = x.tokens_needed
            r[f"{trained.SHORT_NAMES.get(k, k)}: now, tokens for 1.0x"] = f"{x.alpha_now:.2f}, " + (
                f"{t:.0e}" if t <= TOO_FAR else f"beyond {TOO_FAR:.0e}" if not np.isnan(t) else "no rise")
        rows.append(r)
    return pd.DataFrame(rows).style.hide(axis="index")


def skip_figure(searches: dict, ss: pd.DataFrame, skip_n, skip_d, K: int | None):
    """(a) the predictions kept as the greedy search leaves out one more layer; (b) the speed-up of decoding
    with those layers left out, per model (colour) and d (line style); ``K``: the shortlist head's rows."""
    mc, dls = model_colors(), dict(zip(skip_d, ["-", "--", ":", "-."]))
    fig, axes = figures.subplots(1, 2, width=figures.FULL_WIDTH * 0.8, aspect=0.55)
    for name in MODELS:
        s = searches[name]
        axes[0].plot(s["n_skip"], s["agreement"], marker="o", ms=3, color=mc[name], label=name)
        for d in skip_d:
            r = ss[(ss.model == name) & (ss.d == d)]
            axes[1].errorbar(r["n_skip"], r["speedup"], yerr=_yerr(r, "speedup"), fmt="o", ls=dls[d], ms=4,
                             capsize=1.5, lw=0.8, color=mc[name], label=f"{name}, d = {d}")
    axes[0].set(xlabel="layers left out (greedy order)", ylabel="next-token predictions kept", ylim=(0, 1.02),
                title="(a) the search, on training text")
    axes[1].axhline(1.0, color="0.5", lw=0.6, ls="--")
    axes[1].set(xlabel="layers left out", ylabel="speed-up over full depth (×)",
                title="(b) decoding" + (f", shortlist head K = {K}" if K else ""))
    axes[1].set_xticks(skip_n)
    handles, labels = axes[1].get_legend_handles_labels()        # colour: the model; line style: d
    fig.legend(handles, labels, loc="outside lower center", ncols=len(handles), fontsize=6, frameon=False)
    return fig


def skip_table(ss: pd.DataFrame, sk: pd.DataFrame):
    """The training-free drafters as the page shows them, one table a model (``ss``: summary, ``sk``: runs)."""
    n = sk.groupby(["model", "n_skip", "d"])["lossless"].agg(["sum", "size"])
    return plots.split_by(pd.DataFrame({"model": ss["model"], "layers left out, draft length d": [
        f"{int(k)} from layer {int(s0)}, d = {int(d)}" for k, s0, d in zip(ss["n_skip"], ss["s0"], ss["d"])],
                         "predictions kept": [f"{a:.0%}" for a in ss["agreement"]],
                         "acceptance": [f"{a:.0%}" for a in ss["acceptance"]],
                         "needed for 1.0×": [f"{a:.0%}" if np.isfinite(a) else "out of reach" for a in ss["need"]],
                         "speed-up [95% CI]": [ci(r, "speedup") for _, r in ss.iterrows()],
                         "cost model's speed-up": [f"{a:.2f}" for a in ss["predicted"]],
                         "lossless": [f"{int(n.loc[k, 'sum'])}/{int(n.loc[k, 'size'])}"
                                      for k in zip(ss["model"], ss["n_skip"], ss["d"])]}), "model")


def against_full(speed: float, lo: float, hi: float) -> str:
    """'0.96× full depth (95% interval 0.83 to 1.07: not measurably different from full depth)'."""
    return f"{speed:.2f}× full depth (95% interval {lo:.2f} to {hi:.2f}: {versus_full(lo, hi)})"


def versus_full(lo: float, hi: float) -> str:
    """A speed-up's 95% interval against full depth, in words."""
    return "faster than full depth" if lo > 1 else ("not measurably different from full depth" if hi >= 1
                                                    else "slower than full depth")


def skip_notes(searches: dict, sets: dict, ss: pd.DataFrame, sk: pd.DataFrame, skip_n, skip_d, units, L: int,
               shortlist: int, cited: dict | None = None) -> dict:
    """The training-free drafter: what the search keeps, the fastest drafter, what a draft and a verification
    cost in full-depth steps by the cost model, and the model's median error against the measurement. ``cited``:
    {model: its first-ranked row (:func:`earlyexit.chapters.quoted.first_ranked`) with the paired timing's speed (:func:`earlyexit.chapters.quoted.cited`)}, the
    speeds quoted; without it, the grid's."""
    n_lo, n_hi = skip_n[0], skip_n[-1]
    kept = searches["released"].set_index("n_skip")["agreement"]
    order = [set(x.split()) for x in searches["released"].sort_values("n_skip")["skip"]]
    cited = cited or {}
    top = ss.loc[quoted.first_ranked(ss)]
    top = cited.get(top["model"], top)
    out = {f"skip_best_{k}": float(top[v]) for k, v in (("speed", "speedup"), ("lo", "speedup_lo"),
                                                         ("hi", "speedup_hi"), ("acc", "acceptance"), ("need", "need"))}
    for name in MODELS:
        r = cited.get(name, ss.loc[quoted.first_ranked(ss[ss.model == name])])
        out.update({f"skip_{name}_best_speed": float(r["speedup"]),
                    f"skip_{name}_best_label": f"{count(int(r['n_skip']), 'layer')} out, d = {int(r['d'])}"})

    def t(calls):                                         # predicted seconds of these calls
        return costmodel.predict(calls, units)["total"]

    return {**out, "skip_d_str": _and(skip_d), "skip_lo": n_lo, "skip_hi": n_hi,
            "skip_lo_str": count(n_lo, "layer"), "skip_hi_str": count(n_hi, "layer"),
            "skip_best_n_str": count(int(top["n_skip"]), "layer"),
            "skip_head": f"the shortlist head ({shortlist:,d} rows)" if shortlist else "the full head",
            "skip_agree_lo": float(kept[n_lo]), "skip_agree_hi": float(kept[n_hi]),
            "skip_set_hi": ", ".join(map(str, sets["released"][n_hi])),
            "skip_order_hi": ", ".join(next(iter(b - a)) for a, b in zip(order, order[1:n_hi + 1])),
            "c_ratio2": t({"layer:2": 1}) / t({"layer:1": 1}),  # one layer over two columns against one
            "verify_steps": t({"layer:2": L, "head:verify:2": 1, "steps": 1}) / t(budget.full_calls(L)),
            "skip_best_draft_steps": t({"layer:1": L - int(top["n_skip"]),
                                        f"head:{'draft_short' if shortlist else 'draft'}:1": 1}) / t(budget.full_calls(L)),
            "skip_best_model": str(top["model"]), "skip_best_n": int(top["n_skip"]), "skip_best_d": int(top["d"]),
            "skip_lossless": int(sk["lossless"].sum()), "skip_runs": int(len(sk)),
            "skip_verdict": versus_full(top["speedup_lo"], top["speedup_hi"]),
            "skip_pred_err": f"{(ss['predicted'] / ss['speedup'] - 1).abs().median():.0%}",
            "skip_need_str": need_phrase(float(top["need"]))}


def predicted(units: pd.DataFrame, runs: pd.DataFrame, summ: pd.DataFrame, keys) -> list[float]:
    """The cost model's (``units``) speed-up of each configuration of ``summ``, from the calls its runs made
    (``runs``: one row per prompt of :func:`~earlyexit.experiments.timing.spec_point`, ``keys`` the columns that
    identify a configuration in both), averaged over prompts. Greedy decoding fixes the calls; the unit costs
    are timed in each build, so close predictions trade places between builds (pages name a drafter with
    :func:`earlyexit.chapters.quoted.first_ranked`)."""
    out = []
    for _, r in summ.iterrows():
        g = runs[np.logical_and.reduce([runs[k] == r[k] for k in keys])]
        out.append(float(np.mean([compare.predicted_speed(s, f, units) for s, f in zip(g["spec_calls"], g["full_calls"])])))
    return out


def candidates(*families) -> list:
    """(predicted, measured, name, lo, hi, acceptance) speed-up of every drafter configuration. ``families``:
    (summary, name) or (summary, name, config) each, a summary with the columns speedup, speedup_lo, speedup_hi,
    acceptance and ``predicted`` (:func:`predicted`), ``name(row)`` a configuration's name and ``config(row)`` its
    (model, DecodeConfig), which then ends the tuple (for :func:`cite_claim`)."""
    return [(float(r["predicted"]), float(r["speedup"]), f[1](r), float(r["speedup_lo"]), float(r["speedup_hi"]),
             float(r["acceptance"])) + ((f[2](r),) if len(f) > 2 else ()) for f in families for _, r in f[0].iterrows()]


def first_candidate(cands: list) -> tuple:
    """The candidate (:func:`candidates`) a page names: :func:`earlyexit.chapters.quoted.first_ranked` over their
    predictions and acceptances."""
    if not cands:
        raise ValueError("no drafter configuration to rank")
    rows = pd.DataFrame({"predicted": [c[0] for c in cands], "acceptance": [c[5] for c in cands]})
    return cands[quoted.first_ranked(rows)]


def cite_claim(cands: list, cite) -> list:
    """The drafter a page names among :func:`candidates` ``cands`` (made with configs; :func:`first_candidate`),
    its grid speed replaced by ``cite(model, config)`` (:func:`earlyexit.chapters.quoted.paired`: ratio, lo, hi),
    as the one candidate :func:`claim_notes` takes."""
    pred, _, name, _, _, acc, (model, cfg) = first_candidate(cands)
    s = cite(model, cfg)
    return [(pred, float(s["ratio"]), name, float(s["lo"]), float(s["hi"]), acc)]


def claim_notes(candidates: list, need: pd.DataFrame, shortlist: bool, goal: float = SPEED_GOAL) -> dict:
    """The opening's claims: the drafter a page names among ``candidates`` ((predicted, measured speed-up, name,
    lo, hi, acceptance) each; :func:`first_candidate`), its measured speed against full depth and the target, and
    the acceptance the target would take with a draft from layer E (``need``)."""
    _, speed, name, lo, hi = first_candidate(candidates)[:5]
    reach = {"misses": f", short of the {goal:.1f}× target", "meets": f", at or above the {goal:.1f}× target"}
    claim = (f"the drafter the cost model ranks first is “{name}”, measured at {against_full(speed, lo, hi)}"
             + reach.get(meets(speed, goal, lo, hi), f", an interval that holds the {goal:.1f}× target"))
    n = need[(need.shortlist == shortlist) & (need.target == goal)]
    if n["alpha"].isna().all():
        goal_s = f"no acceptance at all reaches {goal:.1f}× with a draft from layer E"
    else:
        g = n.loc[n["alpha"].idxmin()]
        goal_s = (f"{goal:.1f}× would take an acceptance of {g.alpha:.2f} (E = {int(g.E)}, d = {int(g.d)}, "
                  f"{'shortlist' if shortlist else 'full'} head)")
    return {"all_best_speed": speed, "claim_speed": claim, "claim_goal": goal_s}


def strategies_figure(summ: pd.DataFrame, strategies, rule: str):
    """Consistency against layers per token of the ``rule`` rule (thresholds) and oracle exits under each cache
    strategy, (a) released, (b) trained."""
    sc = dict(zip(strategies, figures.palette(3)))
    fig, axes = figures.subplots(1, 2, width=figures.FULL_WIDTH, aspect=0.6, sharey=True)
    for ax, m in zip(axes, MODELS):
        s = summ[(summ.model == m) & (summ.rule != "oracle")]
        plots.plot_tradeoff(ax, s, "layers", "rouge_full", colors=sc, labels={k: f"{rule}, {k}" for k in strategies})
        o = summ[(summ.model == m) & (summ.rule == "oracle")]
        for k in strategies:
            r = o[o.strategy == k]
            ax.errorbar(r["layers"], r["rouge_full"], yerr=_yerr(r, "rouge_full"), fmt="^", color=sc[k], mfc="white",
                        ms=5, lw=0.8, capsize=1.5, label=f"oracle exits, {k}")
        ax.set(xlabel="decoder layers per token", ylabel="ROUGE-L vs full depth",
               title=f"({'ab'[m == 'trained']}) {m}", ylim=(0, 1.05))
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3)
    return fig

def strategies_table(summ: pd.DataFrame, strategies, rule: str, threshold: float, label_of) -> pd.DataFrame:
    """The figure's operating points as numbers, a row per model and cache: consistency with the model's own full
    depth and layers per token at ``threshold`` of ``rule`` (the point whose ``label`` is ``label_of(strategy)``),
    and under oracle exits, where only the cache can be wrong. Means with 95% intervals over prompts."""
    rows = []
    for m in MODELS:
        for k in strategies:
            s = summ[(summ.model == m) & (summ.strategy == k)]
            at, o = s[s.label == label_of(k)], s[s.rule == "oracle"]
            if at.empty or o.empty:
                raise ValueError(f"no {rule} point at {threshold:g} or no oracle point for {m}, {k} in the summary")
            at, o = at.iloc[0], o.iloc[0]
            rows.append({"model": m, "cache": k,
                         f"ROUGE-L, {rule} ≥ {threshold:g}": ci(at, "rouge_full"),
                         f"layers / token, {rule} ≥ {threshold:g}": f"{at['layers']:.1f}",
                         "ROUGE-L, oracle exits": ci(o, "rouge_full"),
                         "layers / token, oracle exits": f"{o['layers']:.1f}"})
    return pd.DataFrame(rows)

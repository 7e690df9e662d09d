"""Chapter 2, "Naive early exit collapses": the scene and its figure, the survival and sweep figures, the tables
of the two harms and of each run's quality, and every sentence whose wording depends on a result.

The sentences name the naive fill strategies the chapter compares (usually naive-mask and naive-undefined) and
say a clause once when the strategies behave the same ("With either naive form the text never diverges ...").
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..book import figures, plots
from ..experiments import metrics, points, probes


def key(strategy: str) -> str:
    """The glue-key suffix of a strategy: "naive-mask" -> "naive_mask"."""
    return strategy.replace("-", "_")


# --------------------------------------------------------------------------- the scene


def pick_scene(lm, es, full: pd.DataFrame, *, prompt: int, token: int, exit: int, n_new: int) -> tuple:
    """The scene's prompt ``b``, its exiting token ``t_star``, that token's exit layer and the exit layer of every
    step up to it, clipped to the prompt set, the generation and the depth. ``exit`` 0 picks the lowest layer
    from half the depth on whose prediction is already the full model's token (half the depth when none is)."""
    L = lm.num_layers
    b = min(prompt, len(es) - 1)
    toks = points.split_ints(full.loc[full.prompt == b, "tokens"].iloc[0])
    t_star = min(token, n_new - 2, len(toks) - 2)
    e = min(exit or L // 2, L - 1)
    if not exit:
        e = probes.lens_exit_layer(lm, es.ids[b], toks, t_star, L // 2) or L // 2
    return b, t_star, e, (L,) * t_star + (e,)


def scene_printout(tok, prompt_text: str, scene: pd.DataFrame, oracle_pts: pd.DataFrame, b: int, t_star: int,
                   strategies) -> str:
    """The scene as text: the end of the prompt, each run's continuation with the exiting step's token in
    brackets, then each naive strategy's text under oracle exits at every token."""
    lines = ["prompt (last 200 characters): " + repr(prompt_text[-200:])]
    for s, g in scene.groupby("strategy", sort=False):
        toks = g.sort_values("t")["token"].tolist()
        head, star, tail = tok.decode(toks[:t_star]), tok.decode(toks[t_star:t_star + 1]), tok.decode(toks[t_star + 1:])
        lines.append(f"\n{s:>16}: {head!r} [{star!r}] {tail!r}")
    lines.append("\nwith oracle exits at every token (the exit layers of panel b in the figure below):")
    for s in strategies:
        r = oracle_pts[(oracle_pts.strategy == s) & (oracle_pts.prompt == b)].iloc[0]
        lines.append(f"{s:>16}: {tok.decode(points.split_ints(r['tokens']))!r}")
    return "\n".join(lines)


def scene_star(same: bool, layer: int) -> str:
    """What the exiting step's token is ("it ..."): the full model's, or not, and why."""
    if same:
        return f"equals the full model's, because layer {layer} already predicts it"
    return f"differs from the full model's: layer {layer} does not predict the full model's token"


def divergence(first: int | None) -> str:
    """Where one strategy's scene text leaves the full model's (``first``: the first differing token, or None)."""
    return "never diverges from the full model's" if first is None else f"leaves the full model's at token {first}"


def scene_divergence(first: dict) -> str:
    """The sentence on where each strategy's text leaves the full model's ({strategy: first differing token or
    None}), said once when every strategy's text does the same."""
    said = {s: divergence(t) for s, t in first.items()}
    if len(said) > 1 and len(set(said.values())) == 1:
        who = "either naive form" if len(said) == 2 else "every naive form"
        return f"With {who} the text {next(iter(said.values()))}."
    parts = [f"with {s} {'the text' if i == 0 else 'it'} {c}" for i, (s, c) in enumerate(said.items())]
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def oracle_clause(exact: bool, ttd: int, plural: bool = False) -> str:
    """What a text decoded with oracle exits does against the full model's ("the text ..."): it is that text, or
    it leaves it after ``ttd`` tokens (at the first token when ``ttd`` is 0)."""
    if exact:
        return "are the full model's throughout" if plural else "is the full model's text throughout"
    verb = "leave" if plural else "leaves"
    if ttd == 0:
        return f"{verb} the full model's at the first token"
    return f"{verb} the full model's after {ttd} token{'' if ttd == 1 else 's'}"


def scene_oracle(results: dict) -> str:
    """The clause on each strategy's text under oracle exits ({strategy: (exact, ttd)}), said once when every
    strategy's text does the same: "both naive texts leave the full model's after 5 tokens"."""
    said = {s: oracle_clause(bool(e), int(t)) for s, (e, t) in results.items()}
    if len(said) > 1 and len(set(said.values())) == 1:
        e, t = next(iter(results.values()))
        if len(said) == 2:
            return f"both naive texts {oracle_clause(bool(e), int(t), plural=True)}"
        return f"every naive text {next(iter(said.values()))}"
    parts = [f"the {s} text {c}" for s, c in said.items()]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def scene_notes(scene: pd.DataFrame, oracle_pts: pd.DataFrame, b: int, t_star: int, e_scene: int,
                strategies) -> dict:
    """The scene's glued values: whether the exiting token is the full model's (``scene_star``), per strategy the
    KL at the next token and over the rest (``scene_kl_next_*``, ``scene_kl_mean_*``), where its text leaves the
    full model's (``scene_div_*``) and what its text does under oracle exits (``scene_oracle_*``), and both as
    one sentence over the strategies (``scene_div``, ``scene_oracle``)."""
    full = scene[scene.strategy == "full depth"].sort_values("t")["token"].tolist()
    same = all(scene[(scene.strategy == s) & (scene.t == t_star)]["token"].iloc[0] == full[t_star] for s in strategies)
    out = {"scene_star": scene_star(same, e_scene)}
    after = scene[scene.t > t_star]
    first, oracle = {}, {}
    for s in strategies:
        g = after[after.strategy == s].sort_values("t")
        out[f"scene_kl_next_{key(s)}"] = float(g["kl"].iloc[0])
        out[f"scene_kl_mean_{key(s)}"] = float(g["kl"].mean())
        diverged = g[g["same"] == 0]
        first[s] = None if diverged.empty else int(diverged["t"].iloc[0])
        out[f"scene_div_{key(s)}"] = divergence(first[s])
        r = oracle_pts[(oracle_pts.strategy == s) & (oracle_pts.prompt == b)].iloc[0]
        oracle[s] = (r["exact_match"] == 1, int(r["ttd"]))
        out[f"scene_oracle_{key(s)}"] = oracle_clause(*oracle[s])
    out["scene_div"] = scene_divergence(first)
    out["scene_oracle"] = scene_oracle(oracle)
    return out


def scene_figure(scene_map: pd.DataFrame, real_map: pd.DataFrame, col_mass: np.ndarray, scene: pd.DataFrame,
                 e_scene: int, t_star: int, strategies):
    """The scene in four panels: (a) the provenance map of the scripted exit, (b) that of oracle exits with the
    first strategy, (c) the next token's attention on the exiting column per layer (``col_mass``: layers ×
    later queries), split where the entry is computed and where it is a hole, (d) each strategy's KL from the
    full model along the text."""
    import matplotlib.pyplot as plt

    L = col_mass.shape[0]
    fig = plt.figure(figsize=(figures.FULL_WIDTH, 4.2), constrained_layout=True)
    gs = fig.add_gridspec(2, 2, width_ratios=[2.3, 1])
    ax_a, ax_b = fig.add_subplot(gs[0, 0]), fig.add_subplot(gs[1, 0])
    ax_c, ax_d = fig.add_subplot(gs[0, 1]), fig.add_subplot(gs[1, 1])
    plots.draw_provenance(ax_a, scene_map, title=f"(a) scripted: one exit at layer {e_scene}", legend=True)
    plots.draw_provenance(ax_b, real_map, title=f"(b) oracle exits, {strategies[0]}", legend=False)
    layers = np.arange(1, L + 1)
    pal4 = figures.palette(4)
    ax_c.bar(layers[:e_scene], col_mass[:e_scene, 0], color=pal4[0], width=0.8, label="(c) entry computed")
    ax_c.bar(layers[e_scene:], col_mass[e_scene:, 0], color=pal4[3], width=0.8, label="(c) entry is a hole")
    ax_c.set(xlabel="layer", ylabel="attention on the column", title="(c) next token's attention")
    for s, c in zip(strategies, figures.palette(len(strategies))):
        g = scene[(scene.strategy == s) & (scene.t != t_star)].sort_values("t")
        ax_d.plot(g["t"], g["kl"], marker="o", ms=2.5, color=c, label=f"(d) {s}", ls="-" if s == strategies[0] else "--")
    ax_d.axvline(t_star, color="0.4", ls=":", lw=0.8)
    ax_d.set_yscale("symlog", linthresh=1e-3)
    ax_d.set(xlabel="generated token t", ylabel="KL(full || method) (nats)", title="(d) drift after the exit",
             ylim=(0, None))
    plots.legend_below(fig, [ax_c, ax_d], ncols=2, loc="outside lower right")   # under panels (c) and (d)
    return fig


# --------------------------------------------------------------------------- holes over a run, survival


def mass_figure(mass_s: pd.DataFrame):
    """The full model's attention mass on holes per layer (mean and 95% interval over prompts)."""
    fig, ax = figures.subplots(aspect=0.6)
    ax.fill_between(mass_s["layer"], mass_s["lo"], mass_s["hi"], alpha=0.3, lw=0)
    ax.plot(mass_s["layer"], mass_s["mean"], marker="o", ms=2.5)
    ax.set(xlabel="layer", ylabel="attention mass on holes", ylim=(0, None))
    return fig


def survival_figure(surv_s: pd.DataFrame, order):
    """Share of outputs still identical to the full model's k tokens after the first early exit, one step curve
    with its 95% interval per strategy of ``order``."""
    colors = dict(zip(order, figures.palette(len(order))))
    styles = dict(zip(order, ["-", "--", ":"]))
    fig, ax = figures.subplots(aspect=0.65)
    for s in order:
        g = surv_s[surv_s.strategy == s]
        ax.fill_between(g["k"], g["lo"], g["hi"], color=colors[s], alpha=0.12, lw=0, step="post")
        ax.plot(g["k"], g["mean"], color=colors[s], label=s, drawstyle="steps-post", ls=styles[s], lw=1.6)
    ax.set(xlabel="tokens after the first early exit", ylabel="share identical to full depth", ylim=(-0.02, 1.05))
    plots.legend_below(fig)
    return fig


def mass_table(mass_s: pd.DataFrame):
    """The attention on holes per layer as a table (folded on the page: one row a layer), leaving out the layers
    where no prompt has a hole."""
    m = mass_s[mass_s["n"] > 0]
    return plots.table(pd.DataFrame({
        "layer": m["layer"].astype(int),
        "attention mass on holes, mean [95% CI]": [f"{a:.3f} [{lo:.3f}, {hi:.3f}]" for a, lo, hi in
                                                   zip(m["mean"], m["lo"], m["hi"])],
        "prompts with a hole at this layer (layers with none left out)": m["n"].astype(int)}))


def oracle_table(oracle_pts: pd.DataFrame):
    """Each cache under oracle exits: share of outputs identical to full depth, tokens until the first difference,
    ROUGE-L against the full model and layers per token (means over prompts)."""
    m = oracle_pts.groupby("strategy")[["exact_match", "ttd", "rouge_full", "layers"]].mean()
    return plots.table(m, {"strategy": "cache (oracle exits)", "exact_match": "outputs identical to full depth",
                           "ttd": "tokens until the first difference", "rouge_full": "ROUGE-L vs full",
                           "layers": "layers / token"},
                       {"exact_match": "{:.0%}", "ttd": "{:.1f}", "layers": "{:.1f}"})


def mask_vs_undefined(mask: float, undefined: float) -> str:
    """How a zero key compares with a masked hole under oracle exits (mean ROUGE-L of each against the full
    model); empty when the chapter ran only one of the two."""
    if not (np.isfinite(mask) and np.isfinite(undefined)):
        return ""
    if f"{undefined:.2f}" == f"{mask:.2f}":
        return ("Treating a hole as a zero key costs as much as masking it here (ROUGE-L "
                f"{mask:.2f} for both under oracle exits).")
    if undefined < mask - 0.02:
        return (f"Treating a hole as a zero key is worse than masking it (ROUGE-L {undefined:.2f} against {mask:.2f} "
                "under oracle exits): the zero key still draws softmax mass and returns nothing.")
    if abs(undefined - mask) <= 0.02:
        return (f"Treating a hole as a zero key costs about as much as masking it here (ROUGE-L {undefined:.2f} "
                f"against {mask:.2f} under oracle exits).")
    return (f"Masking the hole is, surprisingly, worse than reading it as a zero key here (ROUGE-L {mask:.2f} "
            f"against {undefined:.2f} under oracle exits).")


# --------------------------------------------------------------------------- the two harms


PARTS = {"exit_decision": "exit decisions alone", "cache": "cache alone", "interaction": "interaction",
         "total": "total"}


def harm_table(harm: pd.DataFrame):
    """Each part of each strategy's loss as "mean [lo, hi]": rows exit decisions, cache, interaction, total."""
    loss = [f"{m:.2f} [{lo:.2f}, {hi:.2f}]" for m, lo, hi in zip(harm["mean"], harm["lo"], harm["hi"])]
    t = harm.assign(loss=loss).pivot(index="part", columns="strategy", values="loss").loc[list(PARTS)]
    t.index = t.index.map(PARTS).rename("part of the loss (1 − ROUGE-L vs full), mean [95% CI]")
    t.columns.name = None
    return plots.table(t)


def quality_table(runs: pd.DataFrame, seed: int, n_boot: int) -> tuple[pd.DataFrame, pd.Series]:
    """Each (run, strategy)'s layers per step, ROUGE-L against the full model and against the reference (mean
    [95% interval]) and the geometric mean of the reference perplexity; also that perplexity as a Series
    indexed by (run, strategy). ``runs`` has one row per prompt and point, with a ``run`` column."""
    quality = points.summary(runs, ["run", "strategy"], ["layers", "rouge_full", "rouge_ref"], seed=seed,
                             n_boot=n_boot)
    ppl = runs.groupby(["run", "strategy"])["ppl_ref"].apply(
        lambda v: np.exp(np.log(v.dropna()).mean()) if v.notna().any() else np.nan)
    table = pd.DataFrame({
        "layers / step": [metrics.ci(r, "layers", "{:.1f}") for _, r in quality.iterrows()],
        "ROUGE-L vs full": [metrics.ci(r, "rouge_full") for _, r in quality.iterrows()],
        "ROUGE-L vs reference": [metrics.ci(r, "rouge_ref") for _, r in quality.iterrows()],
    }, index=pd.MultiIndex.from_frame(quality[["run", "strategy"]]))
    table["reference perplexity (geo. mean)"] = ppl.reindex(table.index).map(
        lambda v: f"{v:.1f}" if np.isfinite(v) else "")
    return table, ppl


def quality_shown(table: pd.DataFrame):
    """:func:`quality_table`'s table as the page shows it, in two that fit the page (run and cache as columns):
    cost and consistency with the full model, then quality against the reference text."""
    t = table.rename_axis(["run", "cache"]).rename(columns={
        "reference perplexity (geo. mean)": "reference perplexity (geo. mean; blank: not measured)"})
    ref = [c for c in t.columns if "reference" in c]
    return plots.tables([plots.table(t.drop(columns=ref), caption="Cost and consistency with the full model"),
                         plots.table(t[ref], caption="Quality against the reference text")])


def interaction_sentence(inter: float) -> str:
    """What the interaction term of the oracle split (total − exit decision − cache) says about the two harms."""
    if inter < -0.05:
        return (f"The two harms do not add up: the interaction term is {inter:.2f}, because once the exit decisions "
                "have pushed the text off the full model's path a broken cache has less left to break.")
    if inter > 0.05:
        return (f"The two harms compound: the interaction term is {inter:+.2f}, so together they cost more than "
                "the sum of the two alone.")
    if f"{abs(inter):.2f}" == "0.00":
        return "The two harms simply add: the interaction term is zero."
    return f"The two harms roughly add: the interaction term is {inter:.2f}."


# --------------------------------------------------------------------------- the sweep


def free_exits(free: pd.DataFrame, tok, early: int) -> dict:
    """What the softmax rule does with no lower limit (``free``: its point): the share of steps exiting at layer
    ``early`` or below, mean layers, ROUGE-L against the full model and the five most frequent emitted tokens
    (decoded, with their counts and their share of all tokens)."""
    exits = np.concatenate([points.split_ints(s)[1:] for s in free["exits"]])
    toks = np.concatenate([points.split_ints(s)[1:] for s in free["tokens"]])
    common = pd.Series([tok.decode([t]) for t in toks]).value_counts().head(5)
    return {"early": float(np.mean(exits <= early)), "layers": float(free["layers"].mean()),
            "rouge": float(free["rouge_full"].mean()), "common": common, "top_share": float(common.iloc[0] / len(toks))}


def sweep_figure(summ: pd.DataFrame, osumm: pd.DataFrame, strategies, n_new: int):
    """ROUGE-L against the full model (left) and tokens until the first difference (right) against decoder layers
    per token: the rule's thresholds with each strategy and the static exits (``summ``, column ``series``),
    oracle exits with each naive cache (open triangles) and with an exact cache (star, from ``osumm``)."""
    bound = osumm[osumm.strategy == "lazy-recompute"].iloc[0]
    fig, axes = figures.subplots(1, 2, width=figures.FULL_WIDTH, aspect=0.8)
    series = [*strategies, "static exit"]
    colors = dict(zip(series, figures.palette(len(series))))
    panels = ((axes[0], "rouge_full", "ROUGE-L vs full depth"), (axes[1], "ttd", "tokens until first divergence"))
    for ax, y, ylab in panels:
        plots.plot_tradeoff(ax, summ, "layers", y, hue="series", colors=colors, markers={"static exit": "s"})
        for s, m in zip(strategies, ("^", "v")):
            o = osumm[osumm.strategy == s]
            ax.errorbar(o["layers"], o[y], yerr=[o[y] - o[f"{y}_lo"], o[f"{y}_hi"] - o[y]], fmt=m, color=colors[s],
                        mfc="white", ms=5, lw=0.8, capsize=1.5, label=f"oracle exits, {s}")
        top = 1.0 if y == "rouge_full" else n_new
        ax.plot([bound["own_layers"]], [top], "*", color="black", ms=7, label="oracle exits, exact cache")
        ax.axhline(top, color="0.6", lw=0.6, ls=":")
        ax.set(xlabel="decoder layers per token", ylabel=ylab)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3)
    return fig


def sweep_table(summ: pd.DataFrame):
    """The sweep's points (``summ``: column ``series``) as the page shows them: method, operating point, layers per
    token, ROUGE-L against the full model and tokens until the first difference (means and 95% intervals)."""
    return plots.table(pd.DataFrame({
        "method": summ["series"], "operating point": summ["label"],
        "layers / token": [metrics.ci(r, "layers", "{:.1f}") for _, r in summ.iterrows()],
        "ROUGE-L vs full, mean [95% CI]": [metrics.ci(r, "rouge_full") for _, r in summ.iterrows()],
        "tokens until the first difference": [metrics.ci(r, "ttd", "{:.1f}") for _, r in summ.iterrows()]}))

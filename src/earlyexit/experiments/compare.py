"""Every method on every model, on the same prompts: the comparison chapter's tables.

    pts = compare.method_points(lm, es, n_new, rule="softmax", thresholds=[...], min_layer=15,
                                static_layers=[...], e_mins=[...], spec=[(E, d), ...], spec_set=es.subset(4))
    summ = compare.summarize(pts)              # one row per (method, operating point), with intervals
    best = compare.best_at(summ, target=0.95)  # the cheapest point of each method at >= 95% consistency

A *method* is a row family of the Pareto figure: the five fill strategies under the confidence rule, the
static exit (a lower bound that needs no cache fix), SkipDecode, oracle exits with an exact cache (what any
exit rule could at best reach) and LayerSkip self-speculation (exact by construction). Every point comes
from :mod:`earlyexit.experiments.points` and :mod:`earlyexit.experiments.timing`, and so from the result cache when another
chapter computed it.

Columns of :func:`method_points` (one row per prompt and point): method, label, layers (decoder layers
per generated token, recomputation included), consistency (ROUGE-L of the token ids against the full
model's output), exact_match, speed (relative to full depth, *predicted* by the cost model of chapter 9
(:mod:`earlyexit.experiments.costmodel`) from what each run did: a batch's one wall time, or a method and full
depth timed at different moments, is no ratio to cite, and timing every point of every model in turn with
full depth would cost more than the rest of the book; the paired measurements live in chapters 3-5, 7 and 9),
plus the point's own columns.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..engine import DecodeConfig
from . import costs, metrics, points, timing
from .evalset import EvalSet

FILL = ("naive-mask", "naive-undefined", "copy-forward", "lazy-recompute", "eager-recompute")
CLASSIFIER_CACHES = ("naive-mask", "copy-forward", "lazy-recompute")
CLASSIFIED = tuple(f"classifier / {s}" for s in CLASSIFIER_CACHES)
METHODS = (*FILL, *CLASSIFIED, "SkipDecode", "self-speculation", "static exit", "oracle exits")
# bounds and baselines are drawn differently from methods
BOUNDS = ("static exit", "oracle exits")


def method_configs(L: int, n_new: int, *, rule: str, thresholds, min_layer: int, static_layers, e_mins,
                   strategies=FILL, skip_warmup: int = 1) -> list[DecodeConfig]:
    """The early-exit configurations of the Pareto figure on an ``L``-layer model: the confidence rule at each
    threshold with each strategy, the static exits, SkipDecode at each final budget, and oracle exits with an
    exact cache."""
    E = DecodeConfig.early_exit
    cfgs = points.threshold_configs(rule, thresholds, strategies, min_layer=min_layer)
    cfgs += [E("static", layer=int(l)) for l in sorted({min(max(1, int(l)), L) for l in static_layers})]
    cfgs += [E("skipdecode", e_max=L, e_min=int(min(max(e, skip_warmup + 1), L)), horizon=n_new, warmup=skip_warmup)
             for e in sorted(set(e_mins))]
    cfgs += [E("oracle", "lazy-recompute")]
    return cfgs


def predicted_speed(calls, full_calls, units: pd.DataFrame) -> float:
    """Full depth's predicted decoding time over a run's (both calls records, decode phase; ``units`` from
    :func:`earlyexit.experiments.costmodel.measure_units` on a model of the same shape)."""
    return costs.predicted_seconds(full_calls, units, ("decode",)) / costs.predicted_seconds(calls, units, ("decode",))


def method_points(lm, es: EvalSet, n_new: int, *, units: pd.DataFrame, rule: str, thresholds, min_layer: int,
                  static_layers, e_mins, spec=(), spec_set: EvalSet | None = None, strategies=FILL,
                  skip_warmup: int = 1, spec_repeats: int = 1, classifier: str | None = None,
                  classifier_thresholds=()) -> pd.DataFrame:
    """Every method's points on ``lm`` (see the module docstring; ``units``: the cost model's unit costs on a
    model of ``lm``'s shape); one row per prompt and point. With ``classifier`` (a trained exit classifier's
    folder) also the classifier rule at ``classifier_thresholds`` with the caches of :data:`CLASSIFIER_CACHES`
    (methods "classifier / <cache>")."""
    full = points.point(lm, es, n_new, DecodeConfig.full())
    full_calls = full["calls"].iloc[0]
    cfgs = method_configs(lm.num_layers, n_new, rule=rule, thresholds=thresholds, min_layer=min_layer,
                          static_layers=static_layers, e_mins=e_mins, strategies=strategies, skip_warmup=skip_warmup)
    if classifier:
        cfgs += points.threshold_configs("classifier", classifier_thresholds, CLASSIFIER_CACHES, min_layer=min_layer,
                                         classifier=classifier)
    df = points.sweep(lm, es, n_new, cfgs)
    df["method"] = np.select([df.rule == "static", df.rule == "skipdecode", df.rule == "oracle", df.rule == "classifier"],
                             ["static exit", "SkipDecode", "oracle exits", "classifier / " + df.strategy], df.strategy)
    df["consistency"] = df["rouge_full"]
    df["speed"] = [predicted_speed(c, full_calls, units) for c in df["calls"]]
    frames = [df]
    sset = spec_set or es
    for (E, d), sp in _spec_grid(lm, sset, n_new, spec, spec_repeats).items():
        frames.append(_spec_rows(sp, "self-speculation", DecodeConfig.self_speculation(E, d), units))
    return pd.concat(frames, ignore_index=True)


def _spec_grid(lm, es: EvalSet, n_new: int, spec, repeats: int) -> dict:
    """{(E, d): :func:`~earlyexit.experiments.timing.spec_point`} over ``spec``, with transformers' peer where chapter 7
    timed it (so its cached points are read back)."""
    return {(int(E), int(d)): timing.spec_point(lm, es, n_new, int(E), int(d), repeats=repeats,
                                                 peer=timing.has_spec_point(lm, es, n_new, int(E), int(d), repeats))
            for E, d in spec}


def spec_configs(p, released_layers: int, L: int) -> list[tuple[int, int]]:
    """Chapter 8's self-speculation (E, d) on an ``L``-layer model: ``p["exit_layers"]`` (chosen for the released
    model's depth) mapped to ``L`` (:func:`scale_layers`), each with every ``p["draft_lens"]``."""
    return [(E, d) for E in scale_layers(p["exit_layers"], released_layers, L, 1, L - 1) for d in p["draft_lens"]]


DRAFTERS = ("self-speculation, shortlist", "self-speculation, adaptive d", "layer-skip drafter")


def _spec_rows(sp: pd.DataFrame, method: str, cfg: DecodeConfig, units: pd.DataFrame) -> pd.DataFrame:
    speed = [predicted_speed(s, f, units) for s, f in zip(sp["spec_calls"], sp["full_calls"])]
    return pd.DataFrame({
        "prompt": sp["prompt"], "method": method, "rule": "self-speculation", "strategy": "self-speculation",
        "label": [cfg.label] * len(sp), "layers": sp["layers"], "consistency": np.where(sp["lossless"], 1.0, np.nan),
        "exact_match": sp["lossless"].astype(float), "speed": speed, "acceptance": sp["acceptance"],
        "measured": sp["speedup"], "config": [cfg] * len(sp)})   # config: what a quoted speed re-times


def drafter_points(lm, spec_set: EvalSet, n_new: int, spec, p7, released_layers: int, units: pd.DataFrame,
                   repeats: int = 1, plain: bool = False) -> pd.DataFrame:
    """Chapter 7's drafters on ``lm``, as rows of :func:`method_points`: at the model's fastest plain (E, d) of
    ``spec`` (timed), the shortlist draft head (``p7["shortlist"]`` rows) and the adaptive draft length
    (``p7["draft_confidence"]``, d up to the longest of ``spec``, full head and shortlist); and the training-free
    layer-skipping drafter (``p7["skip_layers"]`` of ``released_layers`` layers left out, scaled to ``lm``'s depth,
    chosen by :func:`~earlyexit.experiments.probes.skip_search` on chapter 7's blocks) at every d of
    ``p7["skip_draft_lens"]`` over the shortlist head, as chapter 7 runs it. With ``plain`` the plain grid's rows
    too (a model :func:`model_points` does not cover). The parameters are chapter 7's, so its timed points are
    read from the result cache, not timed again; the fastest (E, d) is chosen by its measured speed, as chapter
    7 chooses it, and every row's ``speed`` is the cost model's (``units``), as in :func:`method_points`."""
    from . import probes

    L = lm.num_layers
    SS = DecodeConfig.self_speculation
    grid = _spec_grid(lm, spec_set, n_new, spec, repeats)
    frames = [_spec_rows(g, "self-speculation", SS(E, d), units) for (E, d), g in grid.items()] if plain else []
    bE, bd = max(grid, key=lambda k: float(grid[k]["speedup"].mean()))
    d_max = max(d for _, d in grid)
    K, c = int(p7["shortlist"]), float(p7["draft_confidence"])
    for method, E, d, kw in (("self-speculation, shortlist", bE, bd, dict(shortlist=K)),
                             ("self-speculation, adaptive d", bE, d_max, dict(confidence=c)),
                             ("self-speculation, adaptive d", bE, d_max, dict(shortlist=K, confidence=c))):
        sp = timing.spec_point(lm, spec_set, n_new, E, d, repeats=repeats, peer=False, **kw)
        frames.append(_spec_rows(sp, method, SS(E, d, **kw), units))
    n_skip = scale_layers(p7["skip_layers"], released_layers, L, 1, L - 2)
    path = probes.skip_search(lm, p7["skip_blocks"], p7["skip_block_tokens"], max(n_skip), seed=p7["seed"])
    path = path.set_index("n_skip")
    for n in n_skip:
        skip = tuple(int(x) for x in path.loc[n, "skip"].split())
        for d in p7["skip_draft_lens"]:
            sp = timing.spec_point(lm, spec_set, n_new, L, d, repeats=repeats, peer=False, skip=skip, shortlist=K)
            frames.append(_spec_rows(sp, "layer-skip drafter", SS(L, d, skip=skip, shortlist=K), units))
    return pd.concat(frames, ignore_index=True)


def model_units(models: dict, p9) -> dict:
    """{key: the cost model's unit costs} for each model of ``models`` (key -> LoadedModel), timed once per shape
    with chapter 9's parameters ``p9`` (``unit_ctx``, ``shortlist``, ``unit_repeats``): a trained checkpoint
    costs what the released model of its shape costs."""
    from . import costmodel

    by_shape, out = {}, {}
    for key, lm in models.items():
        c = lm.config
        shape = (c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads,
                 c.num_key_value_heads, c.vocab_size)
        if shape not in by_shape:
            by_shape[shape] = costmodel.measure_units(lm, ctx=p9["unit_ctx"], shortlist=p9["shortlist"],
                                                      repeats=p9["unit_repeats"])
        out[key] = by_shape[shape]
    return out


def drafters(models: dict, released_layers: int, spec_set: EvalSet, n_new: int, p, p7, units: dict) -> pd.DataFrame:
    """:func:`drafter_points` for each model of ``models`` (key -> LoadedModel) with chapter 8's parameters ``p``
    and chapter 7's ``p7`` (``units``: :func:`model_units`); the plain grid too for a model chapter 8's sweep does
    not cover (not in ``p["models"]``). Adds ``model``, ``L``."""
    frames = []
    for key, lm in models.items():
        pts = drafter_points(lm, spec_set, n_new, spec_configs(p, released_layers, lm.num_layers), p7,
                             released_layers, units[key], p["timing_repeats"], plain=key not in p["models"])
        frames.append(pts.assign(model=key, L=lm.num_layers))
    return pd.concat(frames, ignore_index=True)


def model_points(models: dict, released_layers: int, es: EvalSet, n_new: int, p, spec_set: EvalSet, units: dict,
                 classifiers: dict | None = None, classifier_thresholds=()) -> pd.DataFrame:
    """:func:`method_points` for each model of ``models`` (key -> LoadedModel) with chapter 8's parameters
    ``p``: the released model's thresholds, the trained model's, or the from-scratch models'; layer choices
    made for the released model's depth mapped to each model's (:func:`scale_layers`); ``units``:
    :func:`model_units`. Adds ``model``, ``L``."""
    frames = []
    for key, lm in models.items():
        L = lm.num_layers
        thr = {"released": p["thresholds"], "trained": p["trained_thresholds"]}.get(key, p["scratch_thresholds"])
        spec = spec_configs(p, released_layers, L)
        pts = method_points(lm, es, n_new, units=units[key], rule=p["rule"], thresholds=thr,
                            min_layer=points.default_min_layer(p["min_layer"], L),
                            static_layers=scale_layers(p["static_layers"], released_layers, L),
                            e_mins=scale_layers(p["e_mins"], released_layers, L, 2), spec=spec, spec_set=spec_set,
                            spec_repeats=p["timing_repeats"], classifier=(classifiers or {}).get(key),
                            classifier_thresholds=classifier_thresholds)
        frames.append(pts.assign(model=key, L=L))
    return pd.concat(frames, ignore_index=True)


def best_table(summ: pd.DataFrame, target: float, names: dict, exclude=("oracle exits",)) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(best points, the formatted table) of a :func:`summarize` over models: per model and method the
    point of :func:`best_at`; models shown by their display ``names``."""
    best = best_at(summ[~summ.method.isin(list(exclude))], target, by=("model", "method"))
    shown = best.assign(model=best["model"].map(names))
    return best, table(shown)


def summarize(pts: pd.DataFrame, seed: int = 0, n_boot: int = 2000, by=("method", "label")) -> pd.DataFrame:
    """Mean and 95% bootstrap interval over prompts of layers, consistency and speed per point."""
    return points.summary(pts, list(by), ["layers", "consistency", "speed"], seed=seed, n_boot=n_boot)


def best_at(summ: pd.DataFrame, target: float = 0.95, by=("method",)) -> pd.DataFrame:
    """Per method (and any other ``by`` column), the point with the fewest layers per token whose mean
    consistency is at least ``target``; where none reaches it, the most consistent point, flagged by
    ``meets = False``."""
    rows = []
    for key, g in summ.groupby(list(by), sort=False):
        ok = g[g["consistency"] >= target - 1e-12]
        r = ok.sort_values(["layers", "consistency"], ascending=[True, False]).iloc[0] if len(ok) else \
            g.sort_values(["consistency", "layers"], ascending=[False, True]).iloc[0]
        rows.append({**r.to_dict(), "meets": bool(len(ok))})
    return pd.DataFrame(rows)


def pareto_front(summ: pd.DataFrame, x: str = "layers", y: str = "consistency", lower_x_is_better: bool = True):
    """The points not dominated in (x, y): fewer layers (or more speed) and more consistency."""
    pts = summ.sort_values([x, y], ascending=[lower_x_is_better, False])
    front, best = [], -np.inf
    for _, r in pts.iterrows():
        if r[y] > best + 1e-12:
            front.append(r)
            best = r[y]
    return pd.DataFrame(front)


def error_split(lm, es: EvalSet, n_new: int, *, rule: str, threshold: float, min_layer: int,
                strategies=("naive-mask", "naive-undefined", "copy-forward", "lazy-recompute", "eager-recompute"),
                seed: int = 0, n_boot: int = 2000, with_ppl: bool = False, rule_args: dict | None = None) -> pd.DataFrame:
    """CALM's oracle decomposition of each method's consistency loss (1 − ROUGE-L against the full model) at
    one threshold, per prompt and summarized:

    * exit decision: the rule's exits with an exact cache (lazy recompute), so only the exits are wrong;
    * cache: oracle exits (each token leaves at the lowest layer whose exit already predicts the full
      model's token) with the method's cache, so only the cache is wrong;
    * interaction: what the two do not explain alone (total − exit decision − cache).

    Returns long rows: strategy, part, mean, lo, hi (the parts add up to the total for every prompt).
    ``with_ppl`` reads the rule's points with their reference perplexity (the same entries a chapter that
    reports perplexity computed)."""
    extra = dict(rule_args or {})
    conf = points.sweep(lm, es, n_new, points.threshold_configs(rule, [threshold], strategies, min_layer=min_layer,
                                                                **extra), ppl_for=with_ppl)
    orc = points.sweep(lm, es, n_new, [DecodeConfig.early_exit("oracle", s) for s in strategies])
    exit_only = conf[conf.strategy == "lazy-recompute"].set_index("prompt")["rouge_full"] if \
        "lazy-recompute" in strategies else points.point(
            lm, es, n_new, DecodeConfig.early_exit(rule, "lazy-recompute", min_layer=min_layer, threshold=float(threshold),
                                                   **extra)).set_index("prompt")["rouge_full"]
    rows = []
    for s in strategies:
        total = conf[conf.strategy == s].set_index("prompt")["rouge_full"]
        cache_only = orc[orc.strategy == s].set_index("prompt")["rouge_full"]
        split = metrics.oracle_error_split(1 - total, 1 - exit_only.loc[total.index], 1 - cache_only.loc[total.index])
        for part in ("exit_decision", "cache", "interaction", "total"):
            v = np.asarray(split[part], dtype=float)
            m, lo, hi = metrics.bootstrap_ci(v, n_boot, seed=seed)
            rows.append({"strategy": s, "part": part, "mean": m, "lo": lo, "hi": hi})
    return pd.DataFrame(rows)


def calibrate(lm, cal: EvalSet, test: EvalSet, n_new: int, *, rule: str, strategy: str, thresholds,
              min_layer: int, epsilon: float, delta: float, units: pd.DataFrame,
              rule_args: dict | None = None) -> tuple[float | None, pd.DataFrame, pd.DataFrame]:
    """Learn then Test for a confidence threshold λ (Angelopoulos et al. 2021; CALM §4).

    Loss of a prompt: 1 − ROUGE-L of the method's output against the full model's, in [0, 1]. On the
    calibration prompts, test H0: risk(λ) > ε with the Hoeffding–Bentkus p-value for λ = 1 (never exit)
    and then each threshold downwards, stopping at the first λ not rejected at level δ (fixed-sequence
    testing: family-wise error ≤ δ). With probability ≥ 1 − δ over the calibration draw, every accepted λ has
    risk ≤ ε. The thresholds after the first one not rejected are not run: the procedure never looks at
    them. Returns (the smallest accepted λ or None, the test details per λ tested, and the chosen λ's
    result on the held-out test prompts as a one-row summary with intervals; its speed is the cost model's,
    ``units``, as in :func:`method_points`)."""
    lams = [1.0] + sorted({float(t) for t in thresholds if t < 1.0}, reverse=True)
    extra = dict(rule_args or {})
    tested, losses, layers = [], [], []
    for lam in lams:
        pt = points.sweep(lm, cal, n_new, points.threshold_configs(rule, [lam], [strategy], min_layer=min_layer,
                                                                    **extra))
        tested.append(lam)
        losses.append(1.0 - pt.sort_values("prompt")["rouge_full"].to_numpy())
        layers.append(float(pt["layers"].mean()))
        best, details = metrics.ltt_fixed_sequence(tested, losses, epsilon, delta, return_details=True)
        if not bool(details["accepted"].iloc[-1]):
            break
    details["layers"] = layers
    result = None
    if best is not None:
        t = points.point(lm, test, n_new, DecodeConfig.early_exit(rule, strategy, min_layer=min_layer, threshold=best,
                                                                   **extra))
        t["consistency"] = t["rouge_full"]
        t["risk"] = 1.0 - t["rouge_full"]
        full_calls = points.point(lm, test, n_new, DecodeConfig.full())["calls"].iloc[0]
        t["speed"] = predicted_speed(t["calls"].iloc[0], full_calls, units)
        result = points.summary(t.assign(split="test"), "split", ["consistency", "risk", "layers", "speed"])
    return best, details, result


def scale_layers(layers, L_from: int, L_to: int, lo: int = 1, hi: int | None = None) -> list[int]:
    """Layer indices chosen for an ``L_from``-layer model mapped to the same relative depth of an
    ``L_to``-layer one (rounded, clamped to [lo, hi or L_to], duplicates dropped, order kept)."""
    hi = L_to if hi is None else hi
    out = []
    for l in layers:
        v = int(min(max(round(l * L_to / L_from), lo), hi))
        if v not in out:
            out.append(v)
    return out


def fmt_ci(m: float, lo: float, hi: float, digits: int = 2) -> str:
    """'m [lo, hi]' with ``digits`` decimals."""
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def table(best: pd.DataFrame) -> pd.DataFrame:
    """The summary table of :func:`best_at` rows, formatted for the book."""
    out = pd.DataFrame({
        "model": best["model"] if "model" in best else "",
        "method": best["method"],
        "operating point": best["label"],
        "consistency": [fmt_ci(r.consistency, r.consistency_lo, r.consistency_hi) for r in best.itertuples()],
        "layers/token": [fmt_ci(r.layers, r.layers_lo, r.layers_hi, 1) for r in best.itertuples()],
        "speed vs full": [fmt_ci(r.speed, r.speed_lo, r.speed_hi) for r in best.itertuples()],
        "reaches target": np.where(best["meets"], "yes", "no"),
    })
    return out.reset_index(drop=True)


def wide_table(best: pd.DataFrame, names: dict, layers: dict, never: float = 0.5) -> pd.DataFrame:
    """The summary table shaped for reading: one row per method, one column per model (display ``names``, in
    their order), each cell "operating point: consistency (✓ where it reaches the target), speed vs full".
    A point whose rule never exits (``layers`` per token within ``never`` of the model's depth ``layers[model]``,
    and the full model's output kept: a point that exits and recomputes its holes can also run about ``L``
    layers a token, and it is not marked) is marked "never exits": its consistency is the full model's by
    construction."""
    cols = {}
    keys = [k for k in names if k in set(best["model"])] + [k for k in dict.fromkeys(best["model"]) if k not in names]
    for key in keys:
        b = best[best.model == key].set_index("method")
        trivial = (b["layers"] >= layers[key] - never) & (b["consistency"] >= 1 - 1e-9) \
            & b.index.isin([*FILL, *CLASSIFIED])                                            # exit rules only
        cols[names.get(key, key)] = pd.Series(
            [f"{r.label}{' (never exits)' if t else ''}: {r.consistency:.2f}{' ✓' if r.meets else ''}, {r.speed:.2f}×"
             for r, t in zip(b.itertuples(), trivial)], index=b.index)
    out = pd.DataFrame(cols)
    shown = [m for m in METHODS if m not in BOUNDS] + list(DRAFTERS) + list(BOUNDS)   # drafters after LayerSkip's
    order = [m for m in shown if m in out.index] + [m for m in out.index if m not in shown]
    out = out.loc[order].fillna("")
    out.index.name = "method"
    return out.reset_index()

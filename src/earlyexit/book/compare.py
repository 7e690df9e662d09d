"""Every method on every model, on the same prompts: the comparison chapter's tables.

    pts = compare.method_points(lm, es, n_new, thresholds=[...], min_layer=15, static_layers=[...],
                                e_mins=[...], spec=[(E, d), ...], spec_set=es.subset(4))
    summ = compare.summarize(pts)              # one row per (method, operating point), with intervals
    best = compare.best_at(summ, target=0.95)  # the cheapest point of each method at >= 95% consistency

A *method* is a row family of the Pareto figure: the five fill strategies under the confidence rule, the
static exit (a lower bound that needs no cache fix), SkipDecode, oracle exits with an exact cache (what any
exit rule could at best reach) and LayerSkip self-speculation (exact by construction). Every point comes
from :mod:`earlyexit.experiments` and so from the result cache when another chapter computed it.

Columns of :func:`method_points` (one row per prompt and point): method, label, layers (decoder layers
per generated token, recomputation included), consistency (ROUGE-L of the token ids against the full
model's output), exact_match, speed (tokens/s relative to full depth, measured in the same mode: the batch
of prompts for the batched methods, batch 1 for self-speculation), plus the point's own columns.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import metrics, points, prompts, timing
from .prompts import EvalSet

FILL = ("naive-mask", "naive-undefined", "copy-forward", "lazy-recompute", "eager-recompute")
METHODS = (*FILL, "SkipDecode", "self-speculation", "static exit", "oracle exits")
# bounds and baselines are drawn differently from methods
BOUNDS = ("static exit", "oracle exits")


def method_points(lm, es: EvalSet, n_new: int, *, rule: str, thresholds, min_layer: int, static_layers,
                  e_mins, spec=(), spec_set: EvalSet | None = None, strategies=FILL, skip_warmup: int = 1,
                  spec_repeats: int = 1) -> pd.DataFrame:
    """Every method's points on ``lm`` (see the module docstring); one row per prompt and point."""
    L = lm.num_layers
    rule_kw = {"min_layer": min_layer}
    full = points.point(lm, es, n_new, "full")
    full_speed = float(full["batch_tok_s"].iloc[0])
    cfgs = points.threshold_configs(rule, thresholds, strategies, **rule_kw)
    cfgs += [{"rule": "static", "strategy": "naive-mask", "rule_kw": {"layer": int(l)}}
             for l in sorted({min(max(1, int(l)), L) for l in static_layers})]
    cfgs += [{"rule": "skipdecode", "strategy": "naive-mask",
              "rule_kw": {"e_max": L, "e_min": int(min(max(e, skip_warmup + 1), L)), "horizon": n_new,
                          "warmup": skip_warmup}}
             for e in sorted(set(e_mins))]
    cfgs += [{"rule": "oracle", "strategy": "lazy-recompute"}]
    df = points.sweep(lm, es, n_new, cfgs)
    df["method"] = np.select([df.rule == "static", df.rule == "skipdecode", df.rule == "oracle"],
                             ["static exit", "SkipDecode", "oracle exits"], df.strategy)
    df["consistency"] = df["rouge_full"]
    df["speed"] = df["batch_tok_s"] / full_speed
    frames = [df]
    for E, d in spec:
        peer = _has_peer_point(lm, spec_set or es, n_new, E, d, spec_repeats)  # reuse chapter 7's timing
        sp = timing.spec_point(lm, spec_set or es, n_new, int(E), int(d), repeats=spec_repeats, peer=peer)
        frames.append(pd.DataFrame({
            "prompt": sp["prompt"], "method": "self-speculation", "rule": "self-speculation",
            "strategy": "self-speculation", "label": [f"self-spec E={E} d={d}"] * len(sp),
            "layers": sp["layers"], "consistency": np.where(sp["lossless"], 1.0, np.nan),
            "exact_match": sp["lossless"].astype(float), "speed": sp["speedup"], "acceptance": sp["acceptance"]}))
    out = pd.concat(frames, ignore_index=True)
    return out


def _has_peer_point(lm, es, n_new, E, d, repeats) -> bool:
    """Whether chapter 7 already timed (E, d) with the transformers peer (then reuse that entry)."""
    from . import store

    params = {"prompts": es.spec, "n_new": n_new, "E": int(E), "d": int(d), "repeats": repeats, "peer": True,
              "threads": __import__("torch").get_num_threads()}
    return store.has("spec_point", params, model=lm)


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
                seed: int = 0, n_boot: int = 2000) -> pd.DataFrame:
    """CALM's oracle decomposition of each method's consistency loss (1 − ROUGE-L against the full model) at
    one threshold, per prompt and summarized:

    * exit decision: the rule's exits with an exact cache (lazy recompute), so only the exits are wrong;
    * cache: oracle exits (each token leaves at the lowest layer whose exit already predicts the full
      model's token) with the method's cache, so only the cache is wrong;
    * interaction: what the two do not explain alone (total − exit decision − cache).

    Returns long rows: strategy, part, mean, lo, hi (the parts add up to the total for every prompt)."""
    kw = {"min_layer": min_layer, "threshold": float(threshold)}
    conf = points.sweep(lm, es, n_new, [{"rule": rule, "strategy": s, "rule_kw": kw} for s in strategies])
    orc = points.sweep(lm, es, n_new, [{"rule": "oracle", "strategy": s} for s in strategies])
    exit_only = conf[conf.strategy == "lazy-recompute"].set_index("prompt")["rouge_full"] if \
        "lazy-recompute" in strategies else points.point(lm, es, n_new, rule, "lazy-recompute", kw).set_index(
            "prompt")["rouge_full"]
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
              min_layer: int, epsilon: float, delta: float) -> tuple[float | None, pd.DataFrame, pd.DataFrame]:
    """Learn then Test for a confidence threshold λ (Angelopoulos et al. 2021; CALM §4).

    Loss of a prompt: 1 − ROUGE-L of the method's output against the full model's, in [0, 1]. On the
    calibration prompts, test H0: risk(λ) > ε with the Hoeffding–Bentkus p-value for λ = 1 (never exit)
    and then each threshold downwards, stopping at the first λ not rejected at level δ (fixed-sequence
    testing: family-wise error ≤ δ). With probability ≥ 1 − δ over the calibration draw, every accepted λ has
    risk ≤ ε. Returns (the smallest accepted λ or None, the test details per λ, and the chosen λ's
    result on the held-out test prompts as a one-row summary with intervals)."""
    lams = [1.0] + sorted({float(t) for t in thresholds if t < 1.0}, reverse=True)
    kw = {"min_layer": min_layer}
    pts = points.sweep(lm, cal, n_new, points.threshold_configs(rule, lams, [strategy], **kw))
    losses = [1.0 - pts[np.isclose(pts.threshold, lam)].sort_values("prompt")["rouge_full"].to_numpy() for lam in lams]
    best, details = metrics.ltt_fixed_sequence(lams, losses, epsilon, delta, return_details=True)
    details["layers"] = [float(pts[np.isclose(pts.threshold, lam)]["layers"].mean()) for lam in lams]
    result = None
    if best is not None:
        t = points.point(lm, test, n_new, rule, strategy, {**kw, "threshold": best})
        t["consistency"] = t["rouge_full"]
        t["risk"] = 1.0 - t["rouge_full"]
        full_speed = float(points.point(lm, test, n_new, "full")["batch_tok_s"].iloc[0])
        t["speed"] = t["batch_tok_s"] / full_speed
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


def headline(profile: str, model: str | None = None, device: str | None = None) -> pd.DataFrame:
    """The front page's table: :func:`table` of the best operating points of the released and the trained
    model, with the comparison chapter's parameters under ``profile``. Every number is read from the
    result cache when the comparison chapter has run (the runner executes the front page last)."""
    import torch

    from ..engine.models import load_model
    from ..training import checkpoints as trained
    from . import runner

    p = runner.load_profile(profile).parameters("08_comparison")
    if model is not None and model != p["model"]:
        raise ValueError(f"profile {profile!r} compares {p['model']!r}, not {model!r}")
    before = torch.get_num_threads()
    points.set_threads(p["threads"])  # timing entries are keyed by the thread count they were measured with
    try:
        dev = device or p["device"]
        released = load_model(p["model"], device=dev, dtype=p["dtype"])
        recipes = trained.recipes_for_profile(profile, p["model"])
        models = {"released": released}
        if "trained" in p["models"]:
            models["trained"] = trained.load(recipes["layerskip"], device=dev, dtype=p["dtype"], progress=False)
        L0 = released.num_layers
        es = prompts.eval_set(released, p["prompt_kind"], p["n_prompts"], p["seed"], p["max_prompt_tokens"])
        sset = es.subset(min(p["spec_prompts"], len(es)))
        frames = []
        for key, lm in models.items():
            L = lm.num_layers
            pts = method_points(lm, es, p["max_new_tokens"], rule=p["rule"],
                                thresholds=p["thresholds"] if key == "released" else p["trained_thresholds"],
                                min_layer=min(p["min_layer"] or L // 2, L),
                                static_layers=scale_layers(p["static_layers"], L0, L),
                                e_mins=scale_layers(p["e_mins"], L0, L, 2),
                                spec=[(E, d) for E in scale_layers(p["exit_layers"], L0, L, 1, L - 1)
                                      for d in p["draft_lens"]],
                                spec_set=sset, spec_repeats=p["timing_repeats"])
            frames.append(pts.assign(model=key))
        summ = summarize(pd.concat(frames, ignore_index=True), seed=p["seed"], n_boot=p["n_boot"],
                         by=("model", "method", "label"))
        best = best_at(summ[~summ.method.isin(["oracle exits", "static exit"])], p["target"], by=("model", "method"))
        name = {"smollm2-135m": "SmolLM2-135M-Instruct"}.get(p["model"], p["model"])
        best["model"] = best["model"].map({"released": name, "trained": f"{name} + LayerSkip"})
        return table(best)
    finally:
        torch.set_num_threads(before)

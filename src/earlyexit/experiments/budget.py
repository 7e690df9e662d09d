"""What training buys self-speculation: acceptance along a training run, and the acceptance a draft needs
before it pays, from the measured cost model.

A round of self-speculation with draft depth E and d drafts (:mod:`earlyexit.engine.speculative`) runs the
lower E layers for d + 1 single tokens (the round's d drafts and the last draft's own pass before
verification), the draft head d times (the full head, or a shortlist of K rows), then the upper L − E layers
once over d + 1 columns and the full head over d + 1 rows. If each draft is accepted with probability α,
independently, a round emits ``τ(α, d) = 1 + α + … + α^d`` tokens (the accepted prefix and the full model's
own next token). The speed-up over full depth is ``τ · T_full / T_round`` with both times predicted by
:func:`earlyexit.experiments.costmodel.predict` from the unit costs measured on this machine, so the acceptance
that breaks even (speed-up 1.0×) or reaches a target (1.5×) follows from those units alone.

Along one training run, the acceptance of a one-token draft at each E is measured at every kept checkpoint
(:func:`along_training`), and a straight line in logit(α) against log(training tokens) is fitted to say how
many tokens the acceptance a target needs would take: an extrapolation, which the book labels as one.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..engine.speculative import check_draft
from . import costmodel


def round_calls(L: int, E: int, d: int, shortlist: bool = False, skip=()) -> dict:
    """The calls of one self-speculative round with ``d`` drafts from layer ``E`` of ``L`` (every draft
    proposed; see the module docstring), keyed as :class:`~earlyexit.engine.Result` counts them.

    ``skip`` (layer numbers, 1-based, below E): a layer-skipping draft. With s0 the lowest layer left out
    (0-based; s0 = E without skipping), each draft runs E − len(skip) layers for one token, the last draft's
    own pass runs layers 1..s0, and verification runs layers s0+1..L over the d + 1 columns."""
    top = L if skip else L - 1
    if not (isinstance(E, int) and 1 <= E <= top) or not (isinstance(d, int) and d >= 1):
        raise ValueError(f"need 1 <= E < L = {L} (E = L with skipped layers) and d >= 1, got E={E!r}, d={d!r}")
    check_draft(L, E, d, tuple(skip))          # the engine's own rule for the layers a draft leaves out
    s0 = min([n - 1 for n in skip] + [E])
    return {"layer:1": d * (E - len(set(skip))) + s0, f"layer:{d + 1}": L - s0,
            f"head:{'draft_short' if shortlist else 'draft'}:1": d, f"head:verify:{d + 1}": 1, "steps": 1}


def full_calls(L: int) -> dict:
    """The calls of one full-depth decoding step."""
    return {"layer:1": L, "head:out:1": 1, "steps": 1}


def at_batch(calls: dict, batch: int) -> dict:
    """``calls`` of one sequence as ``batch`` sequences decoding in step would make them: every layer call and head
    read carries ``batch`` times the tokens or rows (the sequences are taken to draft and accept alike)."""
    out = {}
    for key, n in calls.items():
        kind, *rest = key.split(":")
        if kind == "layer":
            rest = [str(int(x) * batch) for x in rest]
        elif kind in ("head", "kv", "check"):
            rest = rest[:-1] + [str(int(rest[-1]) * batch)]
        k = ":".join([kind, *rest])
        out[k] = out.get(k, 0) + n
    return out


def tokens_per_round(alpha, d: int):
    """``1 + α + … + α^d``: tokens a round emits when each draft is accepted with probability ``alpha``."""
    a = np.asarray(alpha, dtype=float)
    return sum(a ** i for i in range(d + 1))


def _round_in_steps(L: int, E: int, d: int, units: pd.DataFrame, shortlist: bool, skip=(), batch: int = 1) -> float:
    """T_round / T_full: what a round costs in full-depth decoding steps (of ``batch`` sequences in step)."""
    t_full = costmodel.predict(at_batch(full_calls(L), batch), units)["total"]
    return costmodel.predict(at_batch(round_calls(L, E, d, shortlist, skip), batch), units)["total"] / t_full


def speedup(alpha, L: int, E: int, d: int, units: pd.DataFrame, shortlist: bool = False, skip=()):
    """Predicted speed-up over full depth at per-draft acceptance ``alpha`` (scalar or array)."""
    return tokens_per_round(alpha, d) / _round_in_steps(L, E, d, units, shortlist, skip)


def needed_acceptance(L: int, E: int, d: int, units: pd.DataFrame, target: float = 1.0,
                      shortlist: bool = False, skip=()) -> float:
    """The per-draft acceptance at which the predicted speed-up reaches ``target``; NaN when even α = 1
    (every draft accepted) falls short."""
    need = target * _round_in_steps(L, E, d, units, shortlist, skip)     # tokens a round must emit
    if tokens_per_round(1.0, d) < need:
        return float("nan")
    if tokens_per_round(0.0, d) >= need:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):                        # tokens per round grow with α: bisection
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tokens_per_round(mid, d) < need else (lo, mid)
    return (lo + hi) / 2


def thresholds(L: int, exits, drafts, units: pd.DataFrame, targets=(1.0, 1.5), shortlists=(False, True)):
    """The needed acceptance for every (E, d, shortlist, target): rows E, d, shortlist, target, alpha."""
    return pd.DataFrame([{"E": E, "d": d, "shortlist": s, "target": t,
                          "alpha": needed_acceptance(L, E, d, units, t, s)}
                         for E in exits for d in drafts for s in shortlists for t in targets])


def along_training(recipes: dict, base, es, n_new: int, exits, device="cpu", dtype=None) -> pd.DataFrame:
    """Acceptance of a one-token draft along each training run: for every recipe of ``recipes``
    ({name: Recipe}) and every step whose weights it kept (step 0: ``base``, the model it started from), the
    agreement of the exit after each layer of ``exits`` with the full model along that model's own greedy
    output on ``es`` (:func:`earlyexit.experiments.probes.generated_agreement`). Rows: recipe, step, tokens
    (training tokens seen), prompt, layer, agreement."""
    from ..training import checkpoints
    from .probes import generated_agreement

    want = set(exits)
    rows = []
    g0 = generated_agreement(base, es, n_new)
    for name, r in recipes.items():
        per_step = r.cfg.batch_size * r.cfg.seq_len
        parts = [(0, g0)]
        for step in checkpoints.snapshots(r):
            lm = checkpoints.load(r, device=device, dtype=dtype, step=step, progress=False)
            parts.append((step, generated_agreement(lm, es, n_new)))
            del lm
        for step, g in parts:
            g = g[g.layer.isin(want)]
            rows.append(g.assign(recipe=name, step=step, tokens=step * per_step))
    out = pd.concat(rows, ignore_index=True)
    return out[["recipe", "step", "tokens", "prompt", "layer", "agreement"]]


def _logit(p):
    p = np.clip(np.asarray(p, dtype=float), 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def fit(tokens, alpha) -> dict:
    """Least-squares line ``logit(α) = a + b · ln(tokens)`` through the points with tokens > 0. Returns
    a, b and n (points used); a and b are NaN with fewer than two distinct token counts."""
    t = np.asarray(tokens, dtype=float)
    y = _logit(alpha)
    keep = t > 0
    if len(set(t[keep])) < 2:
        return {"a": float("nan"), "b": float("nan"), "n": int(keep.sum())}
    b, a = np.polyfit(np.log(t[keep]), y[keep], 1)
    return {"a": float(a), "b": float(b), "n": int(keep.sum())}


def predict_alpha(f: dict, tokens):
    """The fitted acceptance at ``tokens``."""
    z = f["a"] + f["b"] * np.log(np.asarray(tokens, dtype=float))
    return 1 / (1 + np.exp(-z))


def tokens_for(f: dict, alpha: float) -> float:
    """Training tokens at which the fitted line reaches ``alpha``: NaN when the fit does not rise (b ≤ 0)
    or ``alpha`` is NaN (the target cannot be reached at any acceptance); infinity when the line rises so
    slowly that the number overflows a float (beyond any training run)."""
    if not (math.isfinite(f["b"]) and f["b"] > 0) or not math.isfinite(alpha):
        return float("nan")
    if alpha <= 0:
        return 0.0
    z = (float(_logit(alpha)) - f["a"]) / f["b"]
    return float(math.exp(z)) if z < 700 else float("inf")


def extrapolate(acc: pd.DataFrame, need: pd.DataFrame) -> pd.DataFrame:
    """For every recipe of :func:`along_training`'s table ``acc`` and every row of :func:`thresholds`' table
    ``need`` at the same E: the fit of the recipe's mean acceptance against training tokens (a, b), the
    acceptance after its last step, and the training tokens at which the fit reaches the needed acceptance
    (NaN where the target is out of reach or the acceptance does not grow)."""
    rows = []
    mean = acc.groupby(["recipe", "layer", "step", "tokens"], as_index=False)["agreement"].mean()
    for (rec, E), g in mean.groupby(["recipe", "layer"]):
        f = fit(g["tokens"], g["agreement"])
        now = g.sort_values("step").iloc[-1]
        for r in need[need.E == E].itertuples():
            rows.append({"recipe": rec, "E": int(E), "d": r.d, "shortlist": r.shortlist, "target": r.target,
                         "alpha_needed": r.alpha, "alpha_now": float(now["agreement"]),
                         "tokens_now": int(now["tokens"]), "a": f["a"], "b": f["b"],
                         "tokens_needed": tokens_for(f, r.alpha)})
    return pd.DataFrame(rows)


def speedup_at_rate(rate, L: int, E: int, d: int, units: pd.DataFrame, batch: int = 1, shortlist: bool = False):
    """Predicted speed-up over full depth when a fraction ``rate`` of all drafts is accepted (accepted / drafted,
    as LayerSkip's logs and :attr:`earlyexit.engine.Result.acceptance` report it): a round then emits
    ``1 + d · rate`` tokens whatever the order of acceptances, so no independence is assumed. ``batch``: that
    many sequences in step (:func:`at_batch`)."""
    return (1 + d * np.asarray(rate, dtype=float)) / _round_in_steps(L, E, d, units, shortlist, batch=batch)


def break_even_rate(L: int, E: int, d: int, units: pd.DataFrame, batch: int = 1, target: float = 1.0,
                    shortlist: bool = False) -> float:
    """The accepted share of drafts at which :func:`speedup_at_rate` reaches ``target``; NaN beyond every draft
    accepted, 0 when even no acceptance reaches it."""
    rate = (target * _round_in_steps(L, E, d, units, shortlist, batch=batch) - 1) / d
    return float("nan") if rate > 1 else max(0.0, float(rate))


def implied_rate(speedup: float, L: int, E: int, d: int, units: pd.DataFrame, batch: int = 1) -> float:
    """The accepted share of drafts that a measured ``speedup`` implies under the cost model (NaN if none in
    [0, 1] does)."""
    r = break_even_rate(L, E, d, units, batch, target=speedup)
    return r if r == r and 0.0 < r <= 1.0 else float("nan")

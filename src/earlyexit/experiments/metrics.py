"""Metrics: quality against a reference, consistency with the full model, drift, attention on
holes, uncertainty (bootstrap), cost (FLOPs) and Learn-then-Test calibration.

Everything returns plain ``float``\\ s, ``numpy`` arrays, ``dict``\\ s or tidy ``pandas``
DataFrames.  Inputs may be lists, numpy arrays or torch tensors.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

# --------------------------------------------------------------------------- helpers


def _np(x, dtype=None) -> np.ndarray:
    """A numpy array from a list, numpy array or torch tensor (detached, on CPU)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if dtype is not None and str(x.dtype) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        x = x.numpy()
    return np.asarray(x, dtype=dtype)


def _seq(x) -> list:
    """A token sequence: a string is split on whitespace, anything else becomes a list."""
    if isinstance(x, str):
        return x.split()
    return _np(x).reshape(-1).tolist() if hasattr(x, "detach") or isinstance(x, np.ndarray) else list(x)


# --------------------------------------------------------------------------- quality / consistency


def lcs_length(a: Sequence, b: Sequence) -> int:
    """Length of the longest common subsequence (O(|a|·|b|) dynamic programming, one row)."""
    if len(a) < len(b):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(candidate, reference, beta: float = 1.0) -> float:
    """ROUGE-L F-measure (Lin, 2004):  R = LCS/|ref|,  P = LCS/|cand|,
    F = (1+β²)·R·P / (R + β²·P).

    Sequences of token ids, or strings (split on whitespace).  Two empty sequences score 1,
    one empty sequence scores 0."""
    c, r = _seq(candidate), _seq(reference)
    if not c and not r:
        return 1.0
    if not c or not r:
        return 0.0
    lcs = lcs_length(c, r)
    if lcs == 0:
        return 0.0
    rec, prec = lcs / len(r), lcs / len(c)
    return float((1 + beta**2) * rec * prec / (rec + beta**2 * prec))


def exact_match(a, b) -> float:
    """1.0 if the two sequences are identical, else 0.0."""
    return float(_seq(a) == _seq(b))


def tokens_to_divergence(a, b) -> int:
    """Index of the first position where ``a`` and ``b`` differ; ``len(a)`` if they are equal;
    ``min(len(a), len(b))`` if one is a prefix of the other."""
    a, b = _seq(a), _seq(b)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def textual_consistency(candidate, full_depth_output, beta: float = 1.0) -> float:
    """ROUGE-L of an early-exit output against the full-depth model's output on the same prompt
    (the "textual consistency" of CALM, Schuster et al. 2022)."""
    return rouge_l(candidate, full_depth_output, beta)


# --------------------------------------------------------------------------- distributions


def log_softmax(logits, axis: int = -1) -> np.ndarray:
    """Numerically stable log-softmax in float64."""
    x = _np(logits, np.float64)
    x = x - x.max(axis=axis, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=axis, keepdims=True))


def kl_divergence(p_logits, q_logits) -> np.ndarray:
    """KL(p‖q) = Σ_v p_v (log p_v − log q_v) for each position, from logits of shape
    ``(..., V)``; returns float64 of shape ``(...)`` (``p`` is usually the full model)."""
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    if lp.shape != lq.shape:
        raise ValueError(f"shape mismatch: {lp.shape} vs {lq.shape}")
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    return np.maximum(kl, 0.0)  # rounding can give -1e-17


def perplexity(logits, targets, ignore_index: int = -100) -> float:
    """exp(mean negative log-likelihood) of ``targets`` (shape ``(...,)``) under ``logits``
    (shape ``(..., V)``); the targets are the tokens each position predicts (already shifted).
    Positions whose target is ``ignore_index`` are left out."""
    lp = log_softmax(logits)
    t = _np(targets).astype(np.int64)
    if lp.shape[:-1] != t.shape:
        raise ValueError(f"logits {lp.shape} do not match targets {t.shape}")
    keep = t != ignore_index
    if not keep.any():
        return float("nan")
    nll = -np.take_along_axis(lp[keep], t[keep][:, None], axis=-1)
    return float(np.exp(nll.mean()))


# --------------------------------------------------------------------------- attention on holes


def attention_mass_on(states_mask, attn_weights, query_positions=None) -> np.ndarray:
    """Per layer, the fraction of attention probability the *full* model puts on the marked
    key positions (holes / copied states), averaged over heads and over the queries that can
    see at least one marked position.

    ``attn_weights``: ``(L, H, T_q, T_k)`` probabilities; ``states_mask``: bool ``(L, T_k)``.
    Query ``i`` sits at key position ``query_positions[i]`` (default: the last ``T_q`` keys,
    ``T_k − T_q + i``) and sees keys ``≤`` its position (causal).  Returns float64 ``(L,)``;
    ``nan`` for a layer where no query sees a marked position."""
    a = _np(attn_weights, np.float64)
    m = _np(states_mask).astype(bool)
    L, H, Tq, Tk = a.shape
    if m.shape != (L, Tk):
        raise ValueError(f"states_mask must have shape {(L, Tk)}, got {m.shape}")
    qpos = np.arange(Tk - Tq, Tk) if query_positions is None else _np(query_positions).astype(np.int64)
    visible = np.arange(Tk)[None, :] <= qpos[:, None]  # (Tq, Tk)
    mass = np.einsum("lhqk,lk->lhq", a, m.astype(np.float64)).mean(axis=1)  # (L, Tq)
    sees = (visible[None, :, :] & m[:, None, :]).any(axis=-1)  # (L, Tq)
    out = np.full(L, np.nan)
    for layer in range(L):
        if sees[layer].any():
            out[layer] = mass[layer, sees[layer]].mean()
    return out


# --------------------------------------------------------------------------- uncertainty


def bootstrap_ci(values, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float, float]:
    """Percentile bootstrap over prompts: ``(mean, lo, hi)`` with ``lo``/``hi`` the
    ``alpha/2`` and ``1 − alpha/2`` quantiles of the means of ``n_boot`` resamples drawn with
    ``numpy.random.default_rng(seed)`` (Efron & Tibshirani, 1993).  NaNs are left out; no values
    give three NaNs."""
    v = _np(values, np.float64).reshape(-1)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return (float("nan"),) * 3
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(v.mean()), float(lo), float(hi)


def summarize(df: pd.DataFrame, by: Sequence[str] | str, value: str, n_boot: int = 2000,
              alpha: float = 0.05, seed: int = 0) -> pd.DataFrame:
    """One row per group of ``by`` with columns ``by + [mean, lo, hi, n]`` (bootstrap CI of the
    mean of ``value`` over the group's rows, see :func:`bootstrap_ci`)."""
    by = [by] if isinstance(by, str) else list(by)
    rows = []
    for key, g in df.groupby(by, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        mean, lo, hi = bootstrap_ci(g[value].to_numpy(), n_boot, alpha, seed)
        rows.append(dict(zip(by, key), mean=mean, lo=lo, hi=hi, n=int(g[value].notna().sum())))
    return pd.DataFrame(rows, columns=by + ["mean", "lo", "hi", "n"])


# --------------------------------------------------------------------------- cost


def _dims(config) -> dict:
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return dict(hidden=hidden, heads=heads, head_dim=head_dim, kv=kv,
                inter=config.intermediate_size, vocab=config.vocab_size, layers=config.num_hidden_layers)


def layer_params(config) -> int:
    """Weights of one Llama-style decoder layer: Q and O (hidden·H·d each), K and V
    (hidden·H_kv·d each), the gated MLP (3·hidden·intermediate); norms are ignored."""
    d = _dims(config)
    attn = 2 * d["hidden"] * d["heads"] * d["head_dim"] + 2 * d["hidden"] * d["kv"] * d["head_dim"]
    return attn + 3 * d["hidden"] * d["inter"]


def layer_flops(config, ctx_len) -> float:
    """FLOPs of one decoder layer for one token attending to ``ctx_len`` positions:
    2·params (multiply-add per weight) + 4·H·d·ctx (scores q·k and the weighted sum of v)."""
    d = _dims(config)
    return float(2 * layer_params(config) + 4 * d["heads"] * d["head_dim"] * np.asarray(ctx_len, np.float64))


def head_flops(config) -> float:
    """FLOPs of one evaluation of the (shared) LM head: 2·vocab·hidden."""
    d = _dims(config)
    return float(2 * d["vocab"] * d["hidden"])


def kv_projection_flops(config) -> float:
    """FLOPs of the K and V projections of one layer for one token, 2·2·hidden·H_kv·d: the cost
    of filling a layer's cache entry from a copied hidden state (CALM state propagation)."""
    d = _dims(config)
    return float(4 * d["hidden"] * d["kv"] * d["head_dim"])


def cost_summary(layers_run, recompute_layers, kv_copy_layers, head_evals, config, ctx_len) -> dict:
    """Average per-token cost of a decoding trace versus full depth.

    Per generated token: ``layers_run`` decoder layers, ``recompute_layers`` layers re-run for
    earlier tokens (lazy/eager recompute), ``kv_copy_layers`` layers whose K/V were projected
    from a copied state, ``head_evals`` LM-head evaluations (exit tests + the final one);
    ``ctx_len`` is a scalar or the per-token context length.  Full depth runs every layer and
    the head once.  Returns the averages, ``flops_per_token``, ``full_flops_per_token``,
    ``flop_fraction`` (= method / full) and ``effective_layers`` (method FLOPs expressed in
    full-depth decoder layers at the same context)."""
    run, rec, cp, heads = (_np(x, np.float64).reshape(-1) for x in (layers_run, recompute_layers,
                                                                    kv_copy_layers, head_evals))
    n = run.size
    if not (rec.size == cp.size == heads.size == n) or n == 0:
        raise ValueError("per-token arrays must be non-empty and of equal length")
    ctx = np.broadcast_to(_np(ctx_len, np.float64), (n,))
    lf = np.array([layer_flops(config, c) for c in ctx])
    flops = (run + rec) * lf + cp * kv_projection_flops(config) + heads * head_flops(config)
    full = config.num_hidden_layers * lf + head_flops(config)
    return dict(
        avg_layers=float(run.mean()), avg_recompute_layers=float(rec.mean()),
        avg_kv_copy_layers=float(cp.mean()), avg_head_evals=float(heads.mean()),
        flops_per_token=float(flops.mean()), full_flops_per_token=float(full.mean()),
        flop_fraction=float(flops.sum() / full.sum()),
        effective_layers=float(((flops - head_flops(config)) / lf).mean()),
    )


# --------------------------------------------------------------------------- Learn then Test


def _log_binom_cdf(k: int, n: int, p: float) -> float:
    """log P(Bin(n, p) ≤ k), summed in log space."""
    if k < 0:
        return -math.inf
    if k >= n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return -math.inf
    i = np.arange(k + 1)
    logs = (np.array([math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) for j in i])
            + i * math.log(p) + (n - i) * math.log1p(-p))
    top = logs.max()
    return float(top + np.log(np.exp(logs - top).sum()))


def hoeffding_bentkus_pvalue(risk_hat: float, n: int, alpha_target: float) -> float:
    """p-value for H0: risk > α from the empirical risk of ``n`` losses in [0, 1]
    (Bates et al. 2021, RCPS; Angelopoulos et al. 2021, Learn then Test):

        p = min( exp(−n·h₁(min(R̂, α), α)),  e·P(Bin(n, α) ≤ ⌈n·R̂⌉) ),
        h₁(a, b) = a·log(a/b) + (1−a)·log((1−a)/(1−b)).

    Capped at 1."""
    if not 0.0 < alpha_target < 1.0:
        raise ValueError("alpha_target must lie in (0, 1)")
    if n < 1:
        raise ValueError("n must be >= 1")
    a, b = min(max(risk_hat, 0.0), alpha_target), alpha_target
    h1 = (a * math.log(a / b) if a > 0 else 0.0) + (1 - a) * math.log((1 - a) / (1 - b))
    hoeffding = math.exp(-n * h1)
    bentkus = math.e * math.exp(_log_binom_cdf(math.ceil(n * risk_hat - 1e-9), n, b))
    return float(min(1.0, hoeffding, bentkus))


def ltt_fixed_sequence(thresholds_desc, losses_by_threshold, epsilon: float, delta: float,
                       return_details: bool = False):
    """Learn then Test with fixed-sequence testing (Angelopoulos et al. 2021).

    ``thresholds_desc``: λ values from the most conservative (e.g. 1.0, exit almost never)
    downward; ``losses_by_threshold[i]``: the calibration losses in [0, 1] at λ_i.  Walk down
    the sequence testing H0: risk(λ_i) > ε with the Hoeffding-Bentkus p-value; reject while
    p ≤ δ and stop at the first non-rejection.  Every rejected λ controls the risk at level ε
    with probability ≥ 1−δ (family-wise).  Returns the smallest accepted λ (``None`` if even
    the first is not accepted); with ``return_details`` also a DataFrame
    ``[threshold, risk_hat, n, p_value, accepted]``."""
    lams = [float(x) for x in thresholds_desc]
    if len(lams) != len(losses_by_threshold):
        raise ValueError("one loss array per threshold is needed")
    if any(b > a for a, b in zip(lams, lams[1:])):
        raise ValueError("thresholds_desc must be in descending order")
    best, rows, going = None, [], True
    for lam, losses in zip(lams, losses_by_threshold):
        v = _np(losses, np.float64).reshape(-1)
        r = float(v.mean())
        p = hoeffding_bentkus_pvalue(r, v.size, epsilon)
        going = going and p <= delta
        if going:
            best = lam
        rows.append(dict(threshold=lam, risk_hat=r, n=v.size, p_value=p, accepted=going))
    if return_details:
        return best, pd.DataFrame(rows)
    return best


def ltt_min_calibration(epsilon: float, delta: float, risk_hat: float = 0.0, n_max: int = 100_000) -> int | None:
    """The smallest calibration set (number of prompts) on which Learn then Test could accept a threshold at
    tolerance ε and level δ when the empirical risk there is ``risk_hat`` (0: the best case, every
    calibration prompt perfect): the least n with Hoeffding–Bentkus p-value ≤ δ. None if no n ≤ ``n_max``
    does (risk_hat ≥ ε never passes)."""
    if not 0.0 < delta < 1.0:
        raise ValueError("delta must lie in (0, 1)")
    if risk_hat >= epsilon:
        return None
    lo, hi = 1, n_max
    if hoeffding_bentkus_pvalue(risk_hat, hi, epsilon) > delta:
        return None
    while lo < hi:                         # the p-value falls with n at a fixed empirical risk
        mid = (lo + hi) // 2
        if hoeffding_bentkus_pvalue(risk_hat, mid, epsilon) <= delta:
            hi = mid
        else:
            lo = mid + 1
    return lo


# --------------------------------------------------------------------------- CALM oracle split


def oracle_error_split(total_loss, loss_exit_with_true_cache, loss_true_tokens_with_method_cache,
                       baseline_loss=0.0) -> dict:
    """Decompose an early-exit method's loss with CALM's oracle switches (Schuster et al. 2022,
    "Confident Adaptive Language Modeling", §3/§6 on local vs propagated errors):

    * ``exit_decision`` = L(method's exits, full-model cache) − baseline
    * ``cache``         = L(full-model tokens/exits, method's cache) − baseline
    * ``interaction``   = total − baseline − exit_decision − cache

    so ``baseline + exit_decision + cache + interaction == total`` exactly (the remainder
    absorbs whatever the two switches do not explain alone).  ``baseline`` is the full-depth
    model's loss (0 when losses are measured against the full model's own output).  Scalars or
    equal-shape arrays (element-wise)."""
    tot, ex, ca, base = (_np(x, np.float64) for x in (total_loss, loss_exit_with_true_cache,
                                                      loss_true_tokens_with_method_cache, baseline_loss))
    exit_part, cache_part = ex - base, ca - base
    inter = tot - base - exit_part - cache_part
    out = dict(total=tot, baseline=base, exit_decision=exit_part, cache=cache_part, interaction=inter)
    return {k: (float(v) if np.ndim(v) == 0 else v) for k, v in out.items()}


def auc(scores, labels) -> float:
    """Area under the ROC curve: the chance that a random positive scores above a random negative (ties
    count half), by the Mann–Whitney rank sum. NaN when one class is missing."""
    s, y = _np(scores, np.float64).reshape(-1), _np(labels, np.float64).reshape(-1)
    pos, neg = int((y > 0.5).sum()), int((y <= 0.5).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    ranks = pd.Series(s).rank(method="average").to_numpy()
    return float((ranks[y > 0.5].sum() - pos * (pos + 1) / 2) / (pos * neg))


def ci(s, v: str, fmt: str = "{:.2f}") -> str:
    """'mean [lo, hi]' of value ``v`` from a summary row ``s`` (columns v, v_lo, v_hi)."""
    return f"{fmt.format(s[v])} [{fmt.format(s[v + '_lo'])}, {fmt.format(s[v + '_hi'])}]"

"""Tests of earlyexit.experiments.metrics on hand-made inputs."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from earlyexit.experiments import metrics as M

SMOLLM2 = SimpleNamespace(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                          head_dim=64, num_hidden_layers=30, vocab_size=49152)


# --------------------------------------------------------------------------- ROUGE-L & consistency

def test_rouge_l_known_strings():
    # LCS("the cat sat on the mat", "the cat is on the mat") = "the cat on the mat" = 5 of 6 / 6
    assert M.rouge_l("the cat sat on the mat", "the cat is on the mat") == pytest.approx(5 / 6)
    # candidate 4 tokens, reference 6, LCS 3 ("a c e"): P = 3/4, R = 1/2, F1 = 0.6
    assert M.rouge_l("a c e x", "a b c d e f") == pytest.approx(0.6)
    # beta weights recall: F_beta = (1+b²)RP/(R+b²P)
    r, p, b = 0.5, 0.75, 2.0
    assert M.rouge_l("a c e x", "a b c d e f", beta=b) == pytest.approx((1 + b * b) * r * p / (r + b * b * p))
    assert M.rouge_l("same words here", "same words here") == 1.0
    assert M.rouge_l("x y", "a b") == 0.0
    assert M.rouge_l("", "") == 1.0 and M.rouge_l("", "a") == 0.0


def test_rouge_l_on_token_ids_any_container():
    a, b = [1, 2, 3, 4], [1, 3, 4, 5]
    assert M.rouge_l(a, b) == pytest.approx(0.75)
    assert M.rouge_l(np.array(a), torch.tensor(b)) == pytest.approx(0.75)
    assert M.lcs_length([1, 2, 3, 2, 1], [2, 1, 2, 3]) == 3


def test_consistency_metrics():
    assert M.exact_match([1, 2, 3], [1, 2, 3]) == 1.0 and M.exact_match([1, 2, 3], [1, 2, 4]) == 0.0
    assert M.tokens_to_divergence([1, 2, 3], [1, 2, 3]) == 3
    assert M.tokens_to_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert M.tokens_to_divergence([5], [6]) == 0
    assert M.tokens_to_divergence([1, 2], [1, 2, 3]) == 2
    assert M.textual_consistency([1, 2, 3, 4], [1, 3, 4, 5]) == pytest.approx(0.75)


# --------------------------------------------------------------------------- KL & perplexity

def test_kl_identical_is_zero_and_shape():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5, 11)) * 10
    kl = M.kl_divergence(x, x)
    assert kl.shape == (3, 5) and kl.dtype == np.float64 and np.all(kl == 0)
    assert np.all(M.kl_divergence(x, x + 3.0) < 1e-12)  # logits are shift invariant


def test_kl_two_class_known_value():
    p, q = 0.8, 0.4
    expected = p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))
    pl = torch.tensor([[math.log(p), math.log(1 - p)]], dtype=torch.float32)
    ql = np.array([[math.log(q), math.log(1 - q)]]) + 100.0
    assert M.kl_divergence(pl, ql)[0] == pytest.approx(expected, rel=1e-6)


def test_kl_is_stable_for_huge_logits():
    p = np.array([1e4, 0.0, -1e4])
    q = np.array([0.0, 1e4, -1e4])
    kl = M.kl_divergence(p, q)
    assert np.isfinite(kl) and kl == pytest.approx(1e4)


def test_perplexity():
    v = 7
    assert M.perplexity(np.zeros((4, v)), [0, 1, 2, 3]) == pytest.approx(v)  # uniform → V
    logits = np.full((2, 3), -1e9)
    logits[0, 1] = logits[1, 2] = 0.0
    assert M.perplexity(logits, np.array([1, 2])) == pytest.approx(1.0)
    # ignore_index and batch shape
    lg = np.log(np.array([[[0.5, 0.5], [0.25, 0.75]]]))
    assert M.perplexity(lg, np.array([[0, -100]])) == pytest.approx(2.0)
    assert M.perplexity(lg, np.array([[0, 1]])) == pytest.approx(math.exp(-(math.log(0.5) + math.log(0.75)) / 2))


# --------------------------------------------------------------------------- attention mass

def test_attention_mass_on():
    # 2 layers, 2 heads, queries = all 3 positions (causal), keys 3
    a = np.zeros((2, 2, 3, 3))
    a[:, :, 0, 0] = 1.0
    a[:, :, 1, :2] = [0.5, 0.5]
    a[:, 0, 2] = [0.2, 0.3, 0.5]
    a[:, 1, 2] = [0.6, 0.2, 0.2]
    mask = np.array([[False, True, False],   # layer 0: position 1 is a hole
                     [False, False, False]])  # layer 1: none
    out = M.attention_mass_on(mask, a)
    # queries 1 and 2 can see position 1: query 1 → 0.5 (both heads), query 2 → (0.3+0.2)/2
    assert out[0] == pytest.approx((0.5 + 0.25) / 2)
    assert np.isnan(out[1])
    # only the last query (decode step): T_q = 1 at position 2
    out1 = M.attention_mass_on(mask, a[:, :, 2:, :])
    assert out1[0] == pytest.approx(0.25)
    with pytest.raises(ValueError):
        M.attention_mass_on(mask[:, :2], a)


# --------------------------------------------------------------------------- bootstrap

def test_bootstrap_ci_deterministic_and_covers():
    rng = np.random.default_rng(123)
    v = rng.normal(2.0, 1.0, size=50)
    assert M.bootstrap_ci(v, seed=4) == M.bootstrap_ci(v, seed=4)
    assert M.bootstrap_ci(v, seed=4) != M.bootstrap_ci(v, seed=5)
    mean, lo, hi = M.bootstrap_ci(v)
    assert lo < mean < hi and mean == pytest.approx(v.mean())
    covered = 0
    for t in range(200):
        sample = np.random.default_rng(1000 + t).normal(2.0, 1.0, size=40)
        _, lo, hi = M.bootstrap_ci(sample, n_boot=400, seed=t)
        covered += lo <= 2.0 <= hi
    assert covered >= 0.88 * 200  # nominal 95 %, percentile bootstrap is slightly liberal at n=40


def test_bootstrap_edge_cases():
    assert all(math.isnan(x) for x in M.bootstrap_ci([]))
    assert M.bootstrap_ci([3.0]) == (3.0, 3.0, 3.0)
    assert M.bootstrap_ci([1.0, np.nan, 1.0]) == (1.0, 1.0, 1.0)


def test_summarize():
    df = pd.DataFrame({"rule": ["a"] * 4 + ["b"] * 3, "layer": [1, 1, 2, 2, 1, 1, 1],
                       "rouge": [1.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5]})
    s = M.summarize(df, by=["rule", "layer"], value="rouge")
    assert list(s.columns) == ["rule", "layer", "mean", "lo", "hi", "n"]
    assert s.values.tolist() == [["a", 1, 1.0, 1.0, 1.0, 2], ["a", 2, 0.0, 0.0, 0.0, 2], ["b", 1, 0.5, 0.5, 0.5, 3]]
    assert M.summarize(df, by="rule", value="rouge").shape == (2, 5)


# --------------------------------------------------------------------------- cost

def test_head_costs_about_eight_layers_on_smollm2():
    assert M.layer_params(SMOLLM2) == 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536
    for ctx in (0, 128, 512):
        assert 6 <= M.head_flops(SMOLLM2) / M.layer_flops(SMOLLM2, ctx) <= 10
    assert M.head_flops(SMOLLM2) == 2 * 49152 * 576
    assert M.layer_flops(SMOLLM2, 100) - M.layer_flops(SMOLLM2, 0) == 4 * 9 * 64 * 100
    assert M.kv_projection_flops(SMOLLM2) == 2 * 2 * 576 * 3 * 64
    no_head_dim = SimpleNamespace(**{**vars(SMOLLM2), "head_dim": None})
    assert M.layer_flops(no_head_dim, 10) == M.layer_flops(SMOLLM2, 10)


def test_cost_summary():
    n = 4
    full = M.cost_summary([30] * n, [0] * n, [0] * n, [1] * n, SMOLLM2, ctx_len=64)
    assert full["flop_fraction"] == pytest.approx(1.0) and full["avg_layers"] == 30
    assert full["effective_layers"] == pytest.approx(30)
    # half depth, one head: (15 L + H) / (30 L + H)
    L, H = M.layer_flops(SMOLLM2, 64), M.head_flops(SMOLLM2)
    half = M.cost_summary([15] * n, [0] * n, [0] * n, [1] * n, SMOLLM2, ctx_len=64)
    assert half["flop_fraction"] == pytest.approx((15 * L + H) / (30 * L + H))
    # copy-forward of K/V for the 15 skipped layers + an exit test (head) at each of 15 layers
    calm = M.cost_summary([15] * n, [0] * n, [15] * n, [15] * n, SMOLLM2, ctx_len=np.full(n, 64))
    expected = (15 * L + 15 * M.kv_projection_flops(SMOLLM2) + 15 * H) / (30 * L + H)
    assert calm["flop_fraction"] == pytest.approx(expected) and calm["flop_fraction"] > 1  # the head dominates
    rec = M.cost_summary([10, 30], [20, 0], [0, 0], [1, 1], SMOLLM2, ctx_len=64)
    assert rec["flop_fraction"] == pytest.approx(1.0) and rec["avg_recompute_layers"] == 10
    with pytest.raises(ValueError):
        M.cost_summary([1, 2], [0], [0, 0], [1, 1], SMOLLM2, 8)


# --------------------------------------------------------------------------- Learn then Test

def test_hoeffding_bentkus_pvalue():
    # risk well below target with many samples: tiny p; at or above target: p = 1
    assert M.hoeffding_bentkus_pvalue(0.02, 2000, 0.1) < 1e-10
    assert M.hoeffding_bentkus_pvalue(0.1, 2000, 0.1) == 1.0
    assert M.hoeffding_bentkus_pvalue(0.2, 2000, 0.1) == 1.0
    # monotone in n and in risk_hat
    assert M.hoeffding_bentkus_pvalue(0.05, 100, 0.1) > M.hoeffding_bentkus_pvalue(0.05, 1000, 0.1)
    assert M.hoeffding_bentkus_pvalue(0.03, 500, 0.1) < M.hoeffding_bentkus_pvalue(0.06, 500, 0.1)
    # zero observed risk: Hoeffding term = (1-α)^n
    assert M.hoeffding_bentkus_pvalue(0.0, 10, 0.5) <= 0.5**10 + 1e-15
    # Bentkus term by hand: n=20, α=0.3, R̂=0.1 → e·P(Bin(20,0.3) ≤ 2)
    cdf = sum(math.comb(20, k) * 0.3**k * 0.7 ** (20 - k) for k in range(3))
    h = 0.1 * math.log(0.1 / 0.3) + 0.9 * math.log(0.9 / 0.7)
    assert M.hoeffding_bentkus_pvalue(0.1, 20, 0.3) == pytest.approx(min(1, math.exp(-20 * h), math.e * cdf))
    with pytest.raises(ValueError):
        M.hoeffding_bentkus_pvalue(0.1, 10, 1.5)


def test_ltt_fixed_sequence_on_bernoulli_losses():
    rng = np.random.default_rng(0)
    lams = [1.0, 0.9, 0.8, 0.7, 0.6]
    risks = [0.0, 0.01, 0.02, 0.3, 0.01]  # risk grows as λ falls; the last one is below ε again
    n = 3000
    losses = [(rng.random(n) < r).astype(float) for r in risks]
    lam, details = M.ltt_fixed_sequence(lams, losses, epsilon=0.1, delta=0.05, return_details=True)
    # 0.7 (risk 0.3 > ε) is not rejected, so testing stops there: 0.6 is never accepted
    assert lam == 0.8
    assert details["accepted"].tolist() == [True, True, True, False, False]
    assert M.ltt_fixed_sequence(lams, losses, epsilon=0.1, delta=0.05) == 0.8
    # the first threshold already too risky → None
    bad = [(rng.random(n) < 0.5).astype(float)] + losses[1:]
    assert M.ltt_fixed_sequence(lams, bad, epsilon=0.1, delta=0.05) is None
    # few samples: even a true risk of 0.05 cannot be certified below 0.1
    few = [(rng.random(20) < 0.05).astype(float) for _ in lams]
    assert M.ltt_fixed_sequence(lams, few, epsilon=0.1, delta=0.05) is None
    with pytest.raises(ValueError):
        M.ltt_fixed_sequence([0.5, 0.9], losses[:2], 0.1, 0.05)


def test_ltt_controls_risk_on_repeated_draws():
    """Accepting a λ whose true risk exceeds ε happens with probability ≤ δ."""
    lams = [1.0, 0.5]
    bad_accepts = 0
    for t in range(200):
        rng = np.random.default_rng(t)
        losses = [(rng.random(400) < 0.02).astype(float), (rng.random(400) < 0.12).astype(float)]
        bad_accepts += M.ltt_fixed_sequence(lams, losses, epsilon=0.1, delta=0.1) == 0.5
    assert bad_accepts <= 0.1 * 200


# --------------------------------------------------------------------------- CALM oracle split

def test_oracle_error_split_scripted():
    parts = M.oracle_error_split(total_loss=0.75, loss_exit_with_true_cache=0.25,
                                 loss_true_tokens_with_method_cache=0.375)
    assert parts == {"total": 0.75, "baseline": 0.0, "exit_decision": 0.25, "cache": 0.375, "interaction": 0.125}
    with_base = M.oracle_error_split(1.0, 0.5, 0.375, baseline_loss=0.25)
    assert with_base["exit_decision"] == 0.25 and with_base["cache"] == 0.125 and with_base["interaction"] == 0.375
    assert sum(v for k, v in with_base.items() if k != "total") == with_base["total"]
    arr = M.oracle_error_split(np.array([0.5, 1.0]), np.array([0.25, 0.5]), np.array([0.25, 0.0]))
    np.testing.assert_allclose(arr["exit_decision"] + arr["cache"] + arr["interaction"], arr["total"])
    assert arr["interaction"].tolist() == [0.0, 0.5]


def test_ltt_min_calibration_is_the_smallest_set_that_can_pass():
    n = M.ltt_min_calibration(0.25, 0.1)                    # every calibration prompt perfect
    assert n == 9
    assert M.hoeffding_bentkus_pvalue(0.0, n, 0.25) <= 0.1 < M.hoeffding_bentkus_pvalue(0.0, n - 1, 0.25)
    assert M.ltt_min_calibration(0.25, 0.1, risk_hat=0.1) > n   # a noisier risk needs more prompts
    assert M.ltt_min_calibration(0.25, 0.1, risk_hat=0.3) is None

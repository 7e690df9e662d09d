"""The decision frontier: a rule replayed over exit signals reproduces what the engine does with an exact cache
(its exits, and its output identical to full depth up to the first wrong exit, different there), and the
replay's counts and shares match a hand-computed case."""
import numpy as np
import pandas as pd
import pytest
import torch

from earlyexit.experiments import frontier
from earlyexit.experiments.evalset import EvalSet
from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.models import load_model
from earlyexit.training import classifier as C

CFG = C.ClassifierConfig(n_prompts=4, n_new=6, max_prompt_tokens=32, min_layer=2, hidden=8, epochs=3, batch_size=16)


def _sig(L, ml, p, keep, clf=None):
    """Signals of one prompt from arrays (T, layers ml..L-1)."""
    rows = []
    T = len(p)
    for t in range(T):
        for j, n in enumerate(range(ml, L)):
            rows.append({"prompt": 0, "t": t, "layer": n, "p": p[t][j], "clf": (clf or p)[t][j], "sat": p[t][j],
                         "keep": keep[t][j]})
    return pd.DataFrame(rows)


def test_replay_by_hand():
    L, ml = 4, 2                                  # exits after layer 2 or 3
    p = [[0.0, 0.0], [0.95, 0.99], [0.5, 0.97], [0.2, 0.3], [0.99, 0.99]]
    keep = [[1, 1], [1, 1], [0, 1], [1, 1], [0, 1]]
    r = frontier.replay(_sig(L, ml, p, keep), L, "softmax", 0.9)
    assert r["exits"] == [[4, 2, 3, 4, 2]]
    assert r["first_error"] == [4]                # token 4 exits after layer 2, which does not keep it
    assert r["prefix"] == pytest.approx(4 / 5)
    assert r["error_rate"] == pytest.approx(1 / 4)
    assert r["mean_exit"] == pytest.approx((2 + 3 + 4 + 2) / 4)
    c = r["calls"]
    assert c["head:decide:1"] == 1 + 2 + 2 + 1    # checks up to the exit, every allowed layer without one
    assert c["head:out:1"] == 1                   # only the step that ran to full depth reads an output head
    assert c["steps"] == 4
    assert "check:classifier:1" not in c
    rc = frontier.replay(_sig(L, ml, p, keep), L, "classifier", 0.9)
    assert rc["calls"]["check:classifier:1"] == 6 and rc["calls"]["head:out:1"] == 4
    rs = frontier.replay(_sig(L, ml, p, keep), L, "saturation", 0.9)
    assert rs["exits"] == r["exits"] and rs["calls"]["check:saturation:1"] == 6 and "head:decide:1" not in rs["calls"]
    with pytest.raises(ValueError, match="softmax"):
        frontier.replay(_sig(L, ml, p, keep), L, "margin", 0.9)


def test_error_for_prefix():
    assert frontier.error_for_prefix(1.0, 32) == pytest.approx(0.0, abs=1e-12)
    eps = frontier.error_for_prefix(0.9, 32)
    j = np.arange(1, 32)
    share = ((1 - eps) ** (j - 1) * eps * j / 32).sum() + (1 - eps) ** 31
    assert share == pytest.approx(0.9, abs=1e-9) and 0.001 < eps < 0.02
    with pytest.raises(ValueError, match="target"):
        frontier.error_for_prefix(0.0, 32)


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-llama", device="cpu")


@pytest.fixture(scope="module")
def es(lm):
    ids = C.training_prompts(lm, CFG)[:3]
    return EvalSet([None] * len(ids), ids, [None] * len(ids), {"test": "frontier", "n": len(ids)})


def _threshold_between(values, lo_q, hi_q):
    """A threshold in the widest gap of the sorted values between two quantiles: far from every signal, so
    that rounding differences between the full-sequence pass and decoding cannot flip a decision."""
    v = np.sort(np.asarray(values))
    a, b = np.quantile(v, lo_q), np.quantile(v, hi_q)
    v = v[(v >= a) & (v <= b)]
    i = int(np.argmax(np.diff(v)))
    return float((v[i] + v[i + 1]) / 2), float(v[i + 1] - v[i])


@pytest.mark.parametrize("rule", frontier.RULES)
def test_replay_matches_the_engine_with_an_exact_cache(lm, es, rule, counts_dir, tmp_path_factory):
    L, ml, N = lm.num_layers, 2, 8
    folder = C.ensure(lm, CFG, root=tmp_path_factory.mktemp("clf"))
    sig = frontier.signals(lm, es, N, str(folder), ml)
    assert sorted(sig["layer"].unique()) == list(range(ml, L))
    thr, gap = _threshold_between(sig[frontier.COLUMN[rule]], 0.3, 0.9)
    assert gap > 1e-5
    r = frontier.replay(sig, L, rule, thr)
    args = {"classifier": str(folder)} if rule == "classifier" else {}
    cfg = DecodeConfig.early_exit(rule, "lazy-recompute", min_layer=ml, threshold=thr, **args)
    full = decode(lm, es.ids, DecodeConfig.full(), N, stop_at_eos=False)
    for b, ids in enumerate(es.ids):
        got = decode(lm, [ids], cfg, N, stop_at_eos=False)
        fe = r["first_error"][b]
        want, out = full.sequences()[b], got.sequences()[0]
        assert out[:fe] == want[:fe]
        if fe < N:
            assert out[fe] != want[fe]            # the first wrong exit changes the token there
        k = min(fe + 1, N)                          # exits agree up to and including the first wrong one
        assert got.exit_layer[0, :k].tolist() == r["exits"][b][:k]
    assert 0 < r["mean_exit"] <= L


def test_signals_refuses_a_bad_min_layer_before_decoding(lm, es, tmp_path_factory):
    folder = C.ensure(lm, CFG, root=tmp_path_factory.mktemp("clf2"))
    with pytest.raises(ValueError, match="min_layer"):
        frontier.signals(lm, es, 4, str(folder), lm.num_layers)

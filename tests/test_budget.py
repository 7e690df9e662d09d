"""What a self-speculative round costs and the acceptance it needs (book.budget), checked against the engine's
own counts and a hand computation; the fit that extrapolates acceptance along a training run."""
import math

import numpy as np
import pytest
import torch

from earlyexit.experiments import budget, costmodel
from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.models import load_model
from test_costmodel import units_by_hand


@pytest.fixture(scope="module")
def lm():
    torch.set_num_threads(1)
    return load_model("tiny-llama", device="cpu")


@pytest.mark.parametrize("E,d,short", [(2, 1, False), (3, 2, False), (4, 3, True)])
def test_a_round_counts_what_the_engine_runs(lm, E, d, short):
    L = lm.num_layers
    cfg = DecodeConfig.self_speculation(E, d, **({"shortlist": 64} if short else {}))
    r = decode(lm, [[5, 6, 7, 8, 9]], cfg, 17, stop_at_eos=False)
    calls = r.meta["calls"]["decode"]
    rounds = calls["steps"]
    one = budget.round_calls(L, E, d, shortlist=short)
    assert calls == {k: v * rounds for k, v in one.items()}


@pytest.mark.parametrize("skip,d,short", [((2,), 1, True), ((3, 5), 2, False), ((2, 3, 4), 1, False)])
def test_a_layer_skipping_round_counts_what_the_engine_runs(lm, skip, d, short):
    L = lm.num_layers
    cfg = DecodeConfig.self_speculation(L, d, skip=skip, **({"shortlist": 64} if short else {}))
    r = decode(lm, [[5, 6, 7, 8, 9]], cfg, 17, stop_at_eos=False)
    calls = r.meta["calls"]["decode"]
    rounds = calls["steps"]
    one = budget.round_calls(L, L, d, shortlist=short, skip=skip)
    assert calls == {k: v * rounds for k, v in one.items()}


def cheap_head_units():
    """Hand units with a cheap head: a layer over k tokens 1 + k ms, the head over r rows 2·r (a shortlist
    0.5·r), a step's overhead 1."""
    U = units_by_hand()
    U.loc[U.unit == "head", "seconds"] = 2 * U.loc[U.unit == "head", "size"] / 1e3
    U.loc[U.unit == "head_short", "seconds"] = 0.5 * U.loc[U.unit == "head_short", "size"] / 1e3
    U.loc[U.unit == "step", "seconds"] = 1 / 1e3
    return U


def test_speedup_and_needed_acceptance_by_hand():
    U = cheap_head_units()
    L, E, d = 6, 2, 2
    # full step: 6 layers at 2 ms + head 2 + step 1 = 15 ms; a round: 3·2 one-token layer calls (2 ms each) =
    # 12, 4 upper layers over 3 tokens (4 ms each) = 16, 2 draft heads = 4, the verify head over 3 rows = 6, step 1
    t_full, t_round = 15.0, 12 + 16 + 4 + 6 + 1
    assert costmodel.predict(budget.full_calls(L), U)["total"] * 1e3 == pytest.approx(t_full)
    assert costmodel.predict(budget.round_calls(L, E, d), U)["total"] * 1e3 == pytest.approx(t_round)
    for a in (0.0, 0.3, 1.0):
        assert budget.speedup(a, L, E, d, U) == pytest.approx((1 + a + a * a) * t_full / t_round)
    # 1 + a + a^2 = 39/15 at break-even: a = (-1 + sqrt(1 + 4 (39/15 - 1))) / 2
    want = (-1 + math.sqrt(1 + 4 * (t_round / t_full - 1))) / 2
    assert budget.needed_acceptance(L, E, d, U, 1.0) == pytest.approx(want, abs=1e-9)
    # 1.5x needs tau = 3.9 > d + 1 = 3: out of reach even if every draft were accepted
    assert math.isnan(budget.needed_acceptance(L, E, d, U, 1.5))
    # the shortlist head is cheaper, so it needs less acceptance
    assert budget.needed_acceptance(L, E, d, U, 1.0, shortlist=True) < want
    t = budget.thresholds(L, [2, 3], [1, 2], U)
    assert len(t) == 2 * 2 * 2 * 2 and set(t.columns) == {"E", "d", "shortlist", "target", "alpha"}


def test_bad_rounds_are_refused():
    with pytest.raises(ValueError, match="1 <= E < L"):
        budget.round_calls(6, 6, 2)
    with pytest.raises(ValueError, match="d >= 1"):
        budget.round_calls(6, 2, 0)
    with pytest.raises(ValueError, match=r"skipped layers must lie in \[1, 5\]"):
        budget.round_calls(6, 6, 1, skip=(6,))


def test_a_layer_skipping_round_by_hand():
    U = cheap_head_units()
    # L = 6, layers 3 and 5 left out (s0 = 2, 0-based), d = 1: the draft runs 4 one-token layers, the last
    # draft's own pass layers 1..2, verification layers 3..6 over 2 columns: 6 one-token calls (2 ms) = 12,
    # 4 calls over 2 tokens (3 ms) = 12, the draft head 2, the verify head over 2 rows 4, the step 1
    t_round = 12 + 12 + 2 + 4 + 1
    assert costmodel.predict(budget.round_calls(6, 6, 1, skip=(3, 5)), U)["total"] * 1e3 == pytest.approx(t_round)
    assert budget.speedup(0.5, 6, 6, 1, U, skip=(3, 5)) == pytest.approx(1.5 * 15 / t_round)


def test_the_fit_recovers_a_logit_line_and_inverts_it():
    tokens = np.array([0, 1e3, 1e4, 1e5, 1e6])
    a, b = -4.0, 0.25
    alpha = 1 / (1 + np.exp(-(a + b * np.log(np.where(tokens > 0, tokens, 1)))))
    f = budget.fit(tokens, alpha)          # the point at 0 tokens is left out
    assert f["n"] == 4 and f["a"] == pytest.approx(a) and f["b"] == pytest.approx(b)
    assert budget.predict_alpha(f, 1e5) == pytest.approx(alpha[3])
    assert budget.tokens_for(f, float(alpha[4])) == pytest.approx(1e6, rel=1e-6)
    assert math.isnan(budget.tokens_for(f, float("nan")))
    flat = budget.fit([1e3, 1e4], [0.4, 0.3])        # acceptance that falls: no extrapolation
    assert math.isnan(budget.tokens_for(flat, 0.5))
    assert math.isnan(budget.fit([1e3, 1e3], [0.3, 0.4])["b"])


def test_extrapolation_table_reads_the_fit_per_recipe_and_exit():
    import pandas as pd

    rows = []
    for rec, b in (("up", 0.5), ("flat", -0.1)):
        for step in (0, 10, 20, 40):
            t = step * 100
            alpha = 0.2 if t == 0 else float(budget.predict_alpha({"a": -5.0, "b": b}, t))
            rows += [{"recipe": rec, "step": step, "tokens": t, "prompt": p, "layer": 3, "agreement": alpha}
                     for p in range(2)]
    acc = pd.DataFrame(rows)
    need = pd.DataFrame([{"E": 3, "d": 2, "shortlist": False, "target": 1.0, "alpha": 0.6},
                         {"E": 3, "d": 2, "shortlist": False, "target": 1.5, "alpha": float("nan")},
                         {"E": 4, "d": 2, "shortlist": False, "target": 1.0, "alpha": 0.5}])
    x = budget.extrapolate(acc, need).set_index(["recipe", "target"])
    assert len(x) == 4, "E = 4 has no acceptance measured: no row"
    assert x.loc[("up", 1.0), "b"] == pytest.approx(0.5)
    assert x.loc[("up", 1.0), "tokens_needed"] == pytest.approx(math.exp((math.log(0.6 / 0.4) + 5) / 0.5))
    assert x.loc[("up", 1.0), "tokens_now"] == 4000
    assert math.isnan(x.loc[("up", 1.5), "tokens_needed"]) and math.isnan(x.loc[("flat", 1.0), "tokens_needed"])


def test_a_line_that_barely_rises_reaches_its_target_never_in_floats():
    """A fit so flat that the tokens it needs overflow a float says infinity, not an OverflowError (seen on the
    real model at the smoke profile's sizes)."""
    assert math.isinf(budget.tokens_for({"a": -5.0, "b": 1e-4}, 0.9))
    assert budget.tokens_for({"a": 0.0, "b": 1.0}, 0.5) == pytest.approx(1.0)

"""The cost model: what a run counts, and what it predicts from unit costs, checked against a hand count."""
import pandas as pd
import pytest
import torch

from earlyexit.experiments import costmodel, costs
from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.models import load_model


@pytest.fixture(scope="module")
def lm():
    torch.set_num_threads(1)
    return load_model("tiny-llama", device="cpu")


def units_by_hand():
    """Made-up unit costs that make a hand count easy: a layer over k tokens costs 1 + k (ms), a head over r
    rows 10·r, deciding 0.5·r, a K/V copy 0.2·r, a step's overhead 3."""
    rows = [{"unit": "layer", "size": k, "seconds": (1 + k) / 1e3} for k in (1, 2, 3, 4, 8, 16)]
    for r in (1, 2, 4):
        rows += [{"unit": "head", "size": r, "seconds": 10 * r / 1e3},
                 {"unit": "head_short", "size": r, "seconds": 2 * r / 1e3},
                 {"unit": "decide", "size": r, "seconds": 0.5 * r / 1e3},
                 {"unit": "kv", "size": r, "seconds": 0.2 * r / 1e3}]
    rows.append({"unit": "step", "size": 1, "seconds": 3 / 1e3})
    return pd.DataFrame(rows)


def test_a_scripted_run_counts_and_predicts_what_a_hand_count_says(lm):
    L = lm.num_layers   # 6
    ids = [[5, 6, 7, 8, 9]]
    # step inputs t = 1..7; exits of the steps producing tokens 1..5, then full depth
    r = decode(lm, ids, DecodeConfig.early_exit("scripted", "lazy-recompute", exits=(6, 2, 3, 6, 1, 6)), 8,
               stop_at_eos=False)
    calls = r.meta["calls"]["decode"]
    # step 1 exits at 2 (two layers alone; its layers 3..6 wait); step 2 runs layers 1..2 alone and takes
    # token 1 along at layer 3, then exits; step 3 (full) runs layers 1..3 alone and takes tokens 1 and 2 along
    # at layers 4..6; step 4 exits at 1; step 5 runs layer 1 alone and takes token 4 along at layers 2..6;
    # steps 6 and 7 run their six layers alone.
    assert calls == {"check:scripted:1": 3, "head:out:1": 7, "layer:1": 21, "layer:2:1": 6, "layer:3:2": 3,
                     "steps": 7}, calls          # three exits asked for: a scripted exit decides for free
    p = costmodel.predict(calls, units_by_hand())
    own = (21 * 2 + 6 * 2 + 3 * 2) / 1e3                 # every own token alone: C(1) = 2 ms
    rec = (6 * (3 - 2) + 3 * (4 - 2)) / 1e3             # C(2) − C(1), C(3) − C(1)
    assert p["own layers"] == pytest.approx(own)
    assert p["recompute"] == pytest.approx(rec)
    assert p["output head"] == pytest.approx(7 * 10 / 1e3)
    assert p["overhead"] == pytest.approx(7 * 3 / 1e3)
    assert p["deciding"] == 0 and p["copies"] == 0
    assert p["total"] == pytest.approx(own + rec + 0.07 + 0.021)


def test_deciding_copies_and_drafts_are_priced_apart(lm):
    u = units_by_hand()
    p = costmodel.predict({"head:decide:2": 3, "kv:1": 5, "head:draft:1": 4, "head:verify:3": 1}, u, shortlist=8192)
    assert p["deciding"] == pytest.approx(3 * (20 + 1) / 1e3 + 4 * 2 / 1e3)   # softmax on top; draft over the shortlist
    assert p["copies"] == pytest.approx(5 * 0.2 / 1e3)
    assert p["output head"] == pytest.approx(30 / 1e3)                        # verification reads the full head
    # beyond the largest measured size the cost grows linearly
    assert costmodel._interp(u, "layer", 32) == pytest.approx((1 + 32) / 1e3)


def test_copy_forward_and_a_confidence_rule_are_counted(lm):
    r = decode(lm, [[5, 6, 7]], DecodeConfig.early_exit("scripted", "copy-forward", exits=(6, 2, 6)), 4,
               stop_at_eos=False)
    calls = r.meta["calls"]["decode"]
    assert calls["kv:1"] == 4            # token 1 exits at 2: four layers' K/V copied
    s = decode(lm, [[5, 6, 7]], DecodeConfig.early_exit("softmax", threshold=1.0, min_layer=2), 4, stop_at_eos=False)
    assert s.meta["calls"]["decode"]["head:decide:1"] == 3 * (lm.num_layers - 2)   # asked at layers 2..5, never exits


def test_breakdown_per_token(lm):
    b = costs.breakdown({"decode": {"layer:1": 12, "steps": 2, "head:out:1": 2}}, units_by_hand(), per=2)
    assert b["own layers"] == pytest.approx(12 * 2 / 1e3 / 2) and b["total"] == pytest.approx((24 + 6 + 20) / 1e3 / 2)


@pytest.mark.parametrize("strategy", ["naive-mask", "copy-forward", "lazy-recompute", "eager-recompute"])
def test_simulated_calls_match_what_the_engine_counts(lm, strategy):
    """costs.simulate_calls replays the engine's batching from exit layers alone (the bounds use it)."""
    script = (6, 2, 3, 6, 1, 6, 4, 4, 2, 6)
    for prompts in ([[5, 6, 7, 8, 9]], [[5, 6, 7, 8, 9], [11, 12, 13]]):
        r = decode(lm, prompts, DecodeConfig.early_exit("scripted", strategy, exits=script), len(script) + 1,
                   stop_at_eos=False)
        got = {k: v for k, v in r.meta["calls"]["decode"].items() if not k.startswith("check:")}
        exits = [r.exit_layer[b, 1:].tolist() for b in range(len(prompts))]
        assert costs.simulate_calls(exits, lm.num_layers, strategy) == got

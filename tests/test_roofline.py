"""The roofline prices a unit as max(bytes / bandwidth, FLOPs / peak) + kernels x launch cost, in the cost model's
own table layout; a calibration reproduces the published time it was fitted on; unknown devices are refused."""
from types import SimpleNamespace

import pytest

from earlyexit.experiments import budget, costmodel, roofline

SHAPE = SimpleNamespace(layers=4, hidden=1024, intermediate=4096, heads=8, kv_heads=2, head_dim=128, vocab=32000,
                        tied_head=False)


def test_a_layer_costs_what_a_hand_count_says():
    dev = roofline.Device("test", bandwidth_gbs=1000.0, peak_tflops=100.0, launch_us=10.0, source="by hand")
    # one layer: Q 1024*1024, K and V 2*1024*256, O 1024*1024, MLP 3*1024*4096, norms 2*1024
    params = 1024 * 1024 + 2 * 1024 * 256 + 1024 * 1024 + 3 * 1024 * 4096 + 2 * 1024
    assert roofline.layer_params(SHAPE) == params
    ctx = 100
    nbytes = params * 2 + 2 * (ctx + 1) * 2 * 128 * 2           # bf16 weights + K/V of 101 columns
    t = nbytes / 1e12 + 11 * 10e-6                               # memory-bound at one token, 11 kernels
    assert roofline.layer_seconds(SHAPE, dev, 1, ctx, "bfloat16") == pytest.approx(t)
    # at 4096 tokens the same layer is compute-bound: 2 FLOPs a weight a token plus attention
    k = 4096
    flops = 2 * params * k + 4 * k * (ctx + k) * 8 * 128
    assert roofline.layer_seconds(SHAPE, dev, k, ctx, "bfloat16") == pytest.approx(flops / 1e14 + 11 * 10e-6)


def test_the_units_table_feeds_the_cost_model():
    dev = roofline.device("a100-80gb")
    u = roofline.units(SHAPE, dev, "bfloat16", ctx=256)
    assert set(u["unit"]) >= {"layer", "head", "head_short", "decide", "kv", "step"}
    full = costmodel.predict(budget.full_calls(SHAPE.layers), u)["total"]
    assert full == pytest.approx(roofline.step_seconds(SHAPE, dev, "bfloat16", ctx=256))
    # every draft accepted, a shallow draft: a speed-up; no draft accepted: a slow-down
    assert budget.speedup(1.0, SHAPE.layers, 1, 3, u) > 1.0 > budget.speedup(0.0, SHAPE.layers, 1, 3, u)


def test_a_batch_reads_the_weights_once():
    dev = roofline.device("h200")
    one = roofline.layer_seconds(SHAPE, dev.with_launch(0.0), 1, 64, "bfloat16", batch=1)
    eight = roofline.layer_seconds(SHAPE, dev.with_launch(0.0), 8, 64, "bfloat16", batch=8)
    assert one < eight < 2 * one, "eight sequences share one read of the weights"
    assert roofline.step_seconds(SHAPE, dev, "bfloat16", 64, batch=8) < 2 * roofline.step_seconds(SHAPE, dev, "bfloat16", 64)


def test_calibration_reproduces_its_published_time():
    dev = roofline.calibrate(roofline.device("a100-80gb"), SHAPE, ar_ms=3.0, dtype="float16")
    assert roofline.step_seconds(SHAPE, dev, "float16") * 1e3 == pytest.approx(3.0)
    assert dev.launch_us > 0
    with pytest.raises(ValueError, match="below the roofline"):
        roofline.calibrate(roofline.device("a100-80gb"), SHAPE, ar_ms=1e-4)


def test_unknown_device_or_dtype_is_refused_with_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown device 'a100'.*did you mean 'a100-80gb'.*registered: a100-80gb, h100-sxm, h200"):
        roofline.device("a100")
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16"):
        roofline.units(SHAPE, roofline.device("h200"), dtype="int8")


def test_speed_up_at_an_accepted_share_and_its_break_even():
    dev = roofline.device("a100-80gb").with_launch(20.0)
    u = roofline.units(SHAPE, dev, "float16")
    L, E, d = SHAPE.layers, 1, 3
    be = budget.break_even_rate(L, E, d, u)
    assert 0 < be < 1 and budget.speedup_at_rate(be, L, E, d, u) == pytest.approx(1.0)
    assert budget.implied_rate(float(budget.speedup_at_rate(0.6, L, E, d, u)), L, E, d, u) == pytest.approx(0.6)
    # a batch of sequences: the calls carry batch times the tokens
    assert budget.at_batch({"layer:3:2": 1, "head:verify:3": 2, "steps": 1}, 8) == {"layer:24:16": 1,
                                                                                      "head:verify:24": 2, "steps": 1}
    u64 = roofline.units(SHAPE, dev, "float16", batch=64)
    assert costmodel.predict(budget.at_batch(budget.full_calls(L), 64), u64)["total"] == pytest.approx(
        roofline.step_seconds(SHAPE, dev, "float16", batch=64))
    be64 = budget.break_even_rate(L, E, d, u64, batch=64)
    assert be64 != be64 or be64 > be, "at batch 64 the verification is no longer free: it takes more acceptance"

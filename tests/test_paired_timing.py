"""Paired timing: the method and its reference alternate on the same prompts in the same minutes; the ratio per
prompt, its interval over prompts, and a verdict only when the interval excludes 1."""
import math

import pandas as pd
import pytest

from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.models import load_model
from earlyexit.experiments import evalset, speeds, timing


def _runs(ratios_by_group, rounds=3):
    rows = []
    for g, ratios in enumerate(ratios_by_group):
        for k in range(rounds):
            r = ratios[k % len(ratios)]
            rows.append({"group": g, "round": k, "first": "ref" if k % 2 == 0 else "method", "method_s": 1.0 / r,
                         "ref_s": 1.0, "steps": 7, "ratio": r})
    return pd.DataFrame(rows)


def test_the_same_work_reads_as_no_different():
    s = speeds.paired_ratio(_runs([[0.97, 1.02, 0.99], [1.03, 0.99, 1.02], [0.98, 0.97, 1.02], [1.0, 1.01, 0.99]]))
    assert s["lo"] < 1.0 < s["hi"] and s["verdict"] == "no different"
    assert s["groups"] == 4 and s["rounds"] == 3


def test_a_clear_speed_up_or_slow_down_reads_as_such():
    fast = speeds.paired_ratio(_runs([[1.30, 1.32], [1.28, 1.31], [1.33, 1.29], [1.31, 1.30]]))
    assert fast["verdict"] == "faster" and fast["lo"] > 1.2 and fast["ratio"] == pytest.approx(1.305, abs=0.01)
    slow = speeds.paired_ratio(_runs([[0.5, 0.52], [0.49, 0.5], [0.51, 0.5]]))
    assert slow["verdict"] == "slower" and slow["hi"] < 1.0


def test_the_ratio_is_a_geometric_mean_of_per_group_medians():
    s = speeds.paired_ratio(_runs([[2.0, 2.0, 100.0], [0.5, 0.5, 0.5]]))   # an outlier round does not count
    assert s["ratio"] == pytest.approx(1.0)


def test_digits_follow_the_interval():
    wide = speeds.paired_ratio(_runs([[0.6], [1.5], [0.9], [1.3]], rounds=1))
    narrow = speeds.paired_ratio(_runs([[1.001], [1.002], [0.999], [1.0]], rounds=1))
    assert wide["digits"] <= 1 < narrow["digits"]


def test_the_run_to_run_spread_widens_the_interval_in_quadrature():
    runs = _runs([[0.997], [0.998], [0.9975], [0.9985], [0.997], [0.998]], rounds=1)
    tight = speeds.paired_ratio(runs)
    assert tight["verdict"] == "slower" and tight["run_sd"] == 0.0, "a 0.2% effect, tight over prompts"
    wide = speeds.paired_ratio(runs, run_sd=0.003)
    assert wide["ratio"] == tight["ratio"] and wide["run_sd"] == 0.003
    stat = math.log(tight["hi"] / tight["ratio"])
    assert math.log(wide["hi"] / wide["ratio"]) == pytest.approx(math.hypot(stat, 1.96 * 0.003))
    assert math.log(wide["ratio"] / wide["lo"]) == pytest.approx(math.hypot(stat, 1.96 * 0.003))
    assert wide["verdict"] == "no different", "a second run could read it either side of 1.0"
    big = speeds.paired_ratio(_runs([[1.30], [1.31], [1.29], [1.30]], rounds=1), run_sd=0.003)
    assert big["verdict"] == "faster", "a 30% effect stays clear"


def test_the_process_wide_spread_is_what_a_bare_call_adds_and_bad_values_are_refused():
    runs = _runs([[0.99, 1.0], [1.01, 1.0], [1.0, 1.0]])
    speeds.set_run_sd(0.01)
    assert speeds.run_sd() == 0.01 and speeds.paired_ratio(runs)["run_sd"] == 0.01
    assert speeds.paired_ratio(runs, run_sd=0.0)["run_sd"] == 0.0, "an explicit value wins"
    one = speeds.paired_ratio(_runs([[1.2]], rounds=1))
    assert math.isnan(one["lo"]) and one["verdict"] == "no different", "one run: still no interval"
    for bad in (-0.001, float("nan"), 1.0):
        with pytest.raises(ValueError, match=r"run-to-run spread \(run_sd\) must be a number in \[0, 1\)"):
            speeds.set_run_sd(bad)
    with pytest.raises(ValueError, match=r"run-to-run spread \(run_sd\) must be a number in \[0, 1\), got -1"):
        speeds.paired_ratio(runs, run_sd=-1)


def test_paired_runs_alternate_and_take_the_prompt_pass_out(tmp_path, monkeypatch):
    monkeypatch.setattr("earlyexit.paths.CACHE", tmp_path)
    lm = load_model("tiny-llama")
    es = evalset.eval_set(lm, "mix", 4, 0, 64)
    cfg = DecodeConfig.early_exit("static", "copy-forward", layer=3)
    runs = timing.paired_runs(lm, es, 6, cfg, rounds=2, batch=1)
    assert len(runs) == 4 * 2 and set(runs["group"]) == {0, 1, 2, 3}
    assert list(runs[runs.group == 0]["first"]) == ["ref", "method"], "the order alternates by round"
    assert (runs["method_s"] > 0).all() and (runs["ref_s"] > 0).all() and (runs["steps"] == 5).all()
    batched = timing.paired_runs(lm, es, 6, cfg, rounds=1, batch=2)
    assert len(batched) == 2 and (batched["steps"] == 10).all()
    with pytest.raises(ValueError, match=r"batch must be an int in \[1, 4\]"):
        timing.paired_runs(lm, es, 6, cfg, batch=5)
    # the prompt pass is measured inside the run and taken out
    r = decode(lm, es.ids[:1], cfg, 6, stop_at_eos=False)
    assert 0 < r.meta["prefill_s"] < r.wall_s and timing.decode_seconds(r) == pytest.approx(r.wall_s - r.meta["prefill_s"])
    sp = decode(lm, es.ids[:1], DecodeConfig.self_speculation(3, 2), 6, stop_at_eos=False)
    assert 0 < sp.meta["prefill_s"] < sp.wall_s
    hf = decode(lm, es.ids[:1], DecodeConfig.hf_generate(), 6, stop_at_eos=False)
    assert math.isnan(hf.meta["prefill_s"]) and timing.decode_seconds(hf) == hf.wall_s


def test_a_batch_is_timed_as_several_groups_and_its_interval_is_over_them(tmp_path, monkeypatch):
    """A batch's speed from one group of prompts had an interval over its rounds only, and one outlier round put
    SkipDecode at batch 8 at 1.1x [1.0, 1.3] in one timing run and 1.15x [1.11, 1.20] in the next: each disjoint
    group is now a cached entry of its own and the interval is over the groups."""
    from earlyexit.experiments import grouped

    monkeypatch.setattr("earlyexit.paths.CACHE", tmp_path)
    lm = load_model("tiny-llama")
    es = evalset.eval_set(lm, "mix", 4, 0, 64)
    sets = grouped.batch_sets(lm, es, [2, 1, 2], groups=3, single=es.subset(2))
    assert list(sets) == [1, 2] and sets[1] is sets[1] and len(sets[1]) == 2 and len(sets[2]) == 6
    again = grouped.batch_sets(lm, es, [2], groups=3, single=es.subset(2))
    assert again[2].ids == sets[2].ids and again[2].spec == sets[2].spec, "every chapter times the same prompts"
    cfg = DecodeConfig.early_exit("static", "naive-mask", layer=2)
    t = grouped.time_groups(lm, sets[2], 4, cfg, batch=2, repeats=1)
    assert list(t["group"]) == [0, 1, 2] and (t["batch"] == 2).all()
    assert all(len(r.split()) == timing.BATCH_ROUNDS for r in t["round_ratios"])
    s = speeds.speed(t)
    assert s["groups"] == 3 and s["lo"] <= s["ratio"] <= s["hi"]
    # each group is one time_point entry: asking again reads them back
    assert len(list((tmp_path / "timing").glob("*.json"))) == 3
    assert grouped.time_groups(lm, sets[2], 4, cfg, batch=2, repeats=1)["round_ratios"].tolist() == \
        t["round_ratios"].tolist()
    assert len(list((tmp_path / "timing").glob("*.json"))) == 3
    one = grouped.time_groups(lm, sets[1], 4, cfg, batch=1, repeats=1)
    assert len(one) == 2 and "group" not in one, "batch 1: a row per prompt, time_point's own"
    with pytest.raises(ValueError, match="groups"):
        grouped.batch_sets(lm, es, [2], groups=0, single=es)
    with pytest.raises(ValueError, match="batch sizes"):
        grouped.batch_sets(lm, es, [0, 2], groups=2, single=es)
    with pytest.raises(ValueError, match="batch must be"):
        grouped.time_groups(lm, es.subset(2), 4, cfg, batch=3, repeats=1)


def test_a_round_paused_by_another_notebooks_quiet_block_is_taken_again(tmp_path, monkeypatch):
    """Run B of 3042f20 had paired rounds at 0.01x and 15.6x beside rounds at 1.0x: its notebook was suspended
    mid-decode while another held the machine. A round during which the runner's count of pauses moves is
    timed again, both halves together."""
    counts = iter([0, 1, 1, 1])                       # the first attempt spans a pause, the second does not
    calls = []
    monkeypatch.setattr(timing, "pauses", lambda: next(counts))
    assert timing.unpaused(lambda: calls.append(1) or len(calls)) == 2 and len(calls) == 2
    monkeypatch.setattr(timing, "pauses", lambda: 7)
    assert timing.unpaused(lambda: "once") == "once", "nothing pauses: one call"
    flips = iter(range(10_000))                        # a count that always moves: kept after RETAKES tries
    monkeypatch.setattr(timing, "pauses", lambda: next(flips))
    calls.clear()
    timing.unpaused(lambda: calls.append(1))
    assert len(calls) == timing.RETAKES + 1

    monkeypatch.setattr("earlyexit.paths.CACHE", tmp_path)
    lm = load_model("tiny-llama")
    es = evalset.eval_set(lm, "mix", 2, 0, 64)
    decodes, reads = [], []
    real = timing.decode
    monkeypatch.setattr(timing, "decode", lambda *a, **k: decodes.append(1) or real(*a, **k))

    def count():                                      # moves once, inside the first timed round
        reads.append(1)
        return 1 if len(reads) >= 2 else 0
    monkeypatch.setattr(timing, "pauses", count)
    runs = timing.paired_runs(lm, es, 4, DecodeConfig.early_exit("static", "copy-forward", layer=2), rounds=2)
    assert len(runs) == 2 * 2
    assert len(decodes) == 2 + 2 * 2 * 2 + 2, "warm-up, 2 rounds x 2 prompts x (method, reference), one round again"


class _Run:
    def __init__(self, steps):
        self.meta = {} if steps is None else {"step_s": list(steps)}


def test_the_step_floor_takes_each_steps_fastest_round():
    """On the reference machine one step of full depth takes 46-68 ms (1st-99th percentile): each step's fastest
    time over the rounds leaves out what the machine did meanwhile, since a step's work is the same each round."""
    runs = [_Run([0.05, 0.09, 0.05]), _Run([0.07, 0.05, 0.05]), _Run([0.05, 0.05, 0.08])]
    assert timing.step_floor(runs) == pytest.approx(0.15), "a burst in any one round does not count"
    assert timing.step_floor(runs[:1]) == pytest.approx(0.19), "one round: its own total"
    assert math.isnan(timing.step_floor([_Run([0.05]), _Run([0.05, 0.05])])), "steps that do not line up"
    assert math.isnan(timing.step_floor([_Run([0.05]), _Run(None)])), "a peer without per-step times"
    assert math.isnan(timing.step_floor([]))


def test_a_groups_floor_ratio_is_its_ratio_and_the_median_stands_in_without_one():
    runs = _runs([[2.0, 2.0, 2.0], [0.5, 0.5, 0.5]])
    runs["group_ratio"] = [1.1] * 3 + [float("nan")] * 3
    s = speeds.paired_ratio(runs)
    assert s["ratio"] == pytest.approx(math.sqrt(1.1 * 0.5)), "group 0's floor ratio; group 1's median"
    assert speeds.paired_ratio(runs.drop(columns="group_ratio"))["ratio"] == pytest.approx(1.0)


def test_every_decoding_step_is_timed_and_the_floor_makes_the_ratio(tmp_path, monkeypatch):
    monkeypatch.setattr("earlyexit.paths.CACHE", tmp_path)
    lm = load_model("tiny-llama")
    es = evalset.eval_set(lm, "mix", 2, 0, 64)
    cfg = DecodeConfig.early_exit("static", "copy-forward", layer=2)
    r = decode(lm, es.ids[:2], cfg, 6, stop_at_eos=False)
    assert len(r.meta["step_s"]) == 6 and min(r.meta["step_s"]) > 0
    assert sum(r.meta["step_s"]) == pytest.approx(timing.decode_seconds(r), rel=0.05, abs=2e-3)
    sp = decode(lm, es.ids[:1], DecodeConfig.self_speculation(3, 2), 6, stop_at_eos=False)
    assert len(sp.meta["step_s"]) == int(sp.rounds[0]) and min(sp.meta["step_s"]) > 0, "a round of self-speculation"
    assert "step_s" not in decode(lm, es.ids[:1], DecodeConfig.hf_generate(), 6, stop_at_eos=False).meta
    t = timing.time_point(lm, es, 6, cfg, batch=1, repeats=3)
    for _, row in t.iterrows():
        med = sorted(float(x) for x in row["round_ratios"].split())[1]
        assert row["ratio"] > 0 and row["ratio"] != pytest.approx(med, rel=1e-9), "the floor, not the median"
    runs = timing.paired_runs(lm, es, 6, cfg, rounds=2)
    assert (runs["method_floor_s"] <= runs["method_s"] + 1e-9).all() and (runs["ref_floor_s"] <= runs["ref_s"] + 1e-9).all()
    assert (runs["group_ratio"] == runs["ref_floor_s"] / runs["method_floor_s"]).all()

"""experiments.py on a tiny model: points, caching, accounting identities, maps, attention, drift, audit."""
from __future__ import annotations

import types

import numpy as np
import pandas as pd
import pytest
import torch

from earlyexit.experiments import costs, drift, points, probes, evalset, speeds, timing
from earlyexit.book import plots
from earlyexit import paths
from earlyexit.engine.cache import COMPUTED, HOLE
from earlyexit.engine import DecodeConfig

EE = DecodeConfig.early_exit

N = 8


@pytest.fixture(scope="module")
def lm():
    from earlyexit.engine.models import load_model

    before = torch.get_num_threads()
    torch.set_num_threads(1)          # the tiny model decodes far faster on one thread
    yield load_model("tiny-llama")
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def es(lm):
    return evalset.eval_set(lm, "mix", 4, 0, 64)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.getbasetemp() / "cache"
    monkeypatch.setattr(paths, "CACHE", root)
    return root


def test_eval_set_is_deterministic_and_has_references(lm, es):
    again = evalset.eval_set(lm, "mix", 4, 0, 64)
    assert again.ids == es.ids and again.spec == es.spec
    kinds = [p.kind for p in es.prompts]
    assert [r is None for r in es.refs] == [k == "instruction" for k in kinds]
    assert es.subset(2).spec["take"] == 2 and len(es.subset(2)) == 2


def test_full_point_is_consistent_with_itself_and_cached(lm, es):
    df = points.point(lm, es, N, EE("full"))
    L = lm.num_layers
    assert (df["exact_match"] == 1).all() and (df["rouge_full"] == 1).all()
    assert np.allclose(df["layers"], L) and np.allclose(df["exit_rate"], 0)
    assert np.allclose(df["flop_fraction"], 1.0)
    assert (df["ttd"] == df["n_gen"]).all()
    again = points.point(lm, es, N, EE("full"))                 # read from the cache: the same table
    pd.testing.assert_frame_equal(df, again)


def test_oracle_lazy_is_exact_and_layers_add_up(lm, es):
    L = lm.num_layers
    df = points.point(lm, es, N, EE("oracle", "lazy-recompute"))
    assert (df["exact_match"] == 1).all()
    assert (df["hole_reads"] == 0).all()
    total = df["own_layers"] + df["recompute_layers"] + df["pending_layers"]
    assert np.allclose(total, L), total
    eager = points.point(lm, es, N, EE("oracle", "eager-recompute"))
    assert np.allclose(eager["own_layers"] + eager["recompute_layers"], L)


def test_scripted_naive_point_counts_exits_and_hole_reads(lm, es):
    L = lm.num_layers
    exits = (L, 2, L, 3)        # tokens 1 and 3 exit early, the others run all layers
    df = points.point(lm, es, N, EE("scripted", exits=exits))
    for _, r in df.iterrows():
        got = points.split_ints(r["exits"])
        assert got[:4] == [L, 2, L, 3][: len(got[:4])]
    full_gen = df["n_steps"] >= 4
    assert (df.loc[full_gen, "exit_rate"] > 0).all()
    assert (df.loc[df["n_steps"] >= 3, "hole_reads"] > 0).all()     # the step after an exit meets the hole


def test_sweep_with_ppl_for_one_label(lm, es):
    cfgs = points.threshold_configs("softmax", [0.2, 0.9], ["naive-mask"], min_layer=3)
    want = EE("softmax", threshold=0.9).label
    df = points.sweep(lm, es, N, cfgs, ppl_for=[want], progress=False)
    assert set(df["label"]) == {want, EE("softmax", threshold=0.2).label}
    with_ref = df[(df["label"] == want) & df["rouge_ref"].notna()]
    assert (with_ref["ppl_ref"] > 1).all()
    assert df[df["label"] != want]["ppl_ref"].isna().all()


def test_survival_on_hand_made_rows():
    L = 6
    full = pd.DataFrame({"prompt": [0, 1], "tokens": ["1 2 3 4 5 6", "1 2 3 4"]})
    df = pd.DataFrame({"prompt": [0, 1], "tokens": ["1 2 3 9 5 6", "1 2 3 4"],
                       "exits": ["6 6 3 6 6 6", "6 6 6 6"]})
    s = probes.survival(df, full, L, 4).set_index(["prompt", "k"])["same"]
    # prompt 0: first exit at t=2, divergence at t=3 -> same at k=0, differs from k=1 on
    assert s.loc[(0, 0)] == 1.0 and s.loc[(0, 1)] == 0.0 and s.loc[(0, 3)] == 0.0
    assert s.loc[[1]].isna().all()                  # prompt 1 never exits


def test_exit_state_mask_marks_layers_above_each_exit():
    m = probes.exit_state_mask([6, 2, 6, 4], L=6, prompt_len=3, T=6)
    assert m.shape == (6, 6)
    assert m[:, 3].tolist() == [False, False, True, True, True, True]     # token 1's input at column 3
    assert not m[:, 4].any()                                                 # token 2 ran all layers
    assert m[:, 5].tolist() == [False] * 4 + [True, True]
    assert not m[:, :3].any()


def test_provenance_frame_has_holes_exactly_above_the_exit(lm, es):
    L = lm.num_layers
    fr = probes.provenance_point(lm, es, 0, N, EE("scripted", exits=(L, 2)))
    col = fr[fr["position"] == 0]          # token 1's step writes the first generated column
    assert (col[col["layer"] <= 2]["state"] == COMPUTED).all()
    assert (col[col["layer"] > 2]["state"] == HOLE).all()
    assert (fr[fr["position"] != 0]["state"] != HOLE).all()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    plots.draw_provenance(ax, fr, title="t")
    plt.close(fig)


def test_attention_above_exits_is_a_probability_mass(lm, es):
    df = points.point(lm, es, N, EE("oracle", "naive-mask"))
    mass = probes.attention_above_exits(lm, es, df)
    v = mass["mass"].dropna()
    assert len(v) and ((v >= 0) & (v <= 1 + 1e-6)).all()
    assert mass[mass["layer"] == 1]["mass"].isna().all()      # no exit lies below layer 1


def test_drift_lazy_is_exact_and_copies_are_not(lm, es):
    L = lm.num_layers
    sub = es.subset(2)
    d = drift.drift_point(lm, sub, 10, [EE("softmax", s, threshold=0.2, min_layer=2)
                                     for s in ("lazy-recompute", "copy-forward")])
    lazy = d[d["strategy"] == "lazy-recompute"]
    assert lazy[lazy["exit"] == L]["kl"].max() < 1e-6
    assert np.nanmax(lazy[["k_err_computed", "v_err_computed"]].to_numpy()) < 1e-4
    copy = d[d["strategy"] == "copy-forward"]
    if copy["k_err_copied"].notna().any():
        assert copy["k_err_copied"].max() > 1e-3


def test_lazy_audit_matches_the_full_cache(lm, es):
    a = drift.lazy_audit(lm, es.ids[0], N, "scripted", exits=(lm.num_layers, 2, 3, 1))
    assert a["holes_after_flush"] == 0 and a["recomputed_entries"] > 0
    assert a["max_abs_k"] < 1e-4 and a["max_abs_v"] < 1e-4


def test_time_point_rows(lm, es):
    t1 = timing.time_point(lm, es.subset(2), 4, EE("full"), batch=1, repeats=1)
    assert len(t1) == 2 and (t1["tok_s"] > 0).all()
    tb = timing.time_point(lm, es.subset(2), 4, EE("skipdecode", e_max=6, e_min=3, horizon=4, warmup=1), batch=2,
                           repeats=1)
    assert len(tb) == 1 and tb["batch"].iloc[0] == 2 and tb["layers"].iloc[0] < 6
    # paired with full depth: every row carries full depth's speed from the same minutes and the per-round ratios;
    # a batched timing has one group, so it runs at least BATCH_ROUNDS rounds for its interval
    assert (t1["ref_tok_s"] > 0).all() and len(t1["round_ratios"].iloc[0].split()) == 1
    assert len(tb["round_ratios"].iloc[0].split()) == timing.BATCH_ROUNDS
    s = speeds.speed(tb)
    assert s["groups"] == 1 and s["rounds"] == timing.BATCH_ROUNDS and s["lo"] <= s["ratio"] <= s["hi"]
    with pytest.raises(ValueError, match="repeats"):
        timing.time_point(lm, es.subset(2), 4, EE("full"), repeats=0)


def test_skip_schedule_layers_shrink_and_nest():
    s = probes.skip_schedule(30, 40, e_max=30, e_min=10, horizon=32, warmup=1)
    sets = s[s["runs"]].groupby("t")["layer"].apply(set)
    for a, b in zip(sets.iloc[:-1], sets.iloc[1:]):
        assert b <= a
    assert len(sets.iloc[-1]) == 10 and 1 in sets.iloc[-1] and 30 in sets.iloc[-1]


def test_flop_breakdown_of_full_depth_and_head_cost_on_smollm2_shape(lm, es):
    df = points.point(lm, es, N, EE("full"))
    fb = costs.flop_breakdown(lm, df)
    assert np.allclose(fb.sum(axis=1), 1.0, atol=1e-6)
    smol = types.SimpleNamespace(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                                 intermediate_size=1536, vocab_size=49152, num_hidden_layers=30)
    head = costs.head_in_layers(types.SimpleNamespace(config=smol))
    assert 7 < head < 8.5          # the shared head costs about eight decoder layers


def test_set_threads_and_labels():
    from earlyexit.engine.threads import set_threads

    n = torch.get_num_threads()
    assert set_threads(0) == n
    assert EE("static", layer=3).label == "static@3"
    assert EE("softmax", "copy-forward", threshold=0.9).label == "softmax 0.9 / copy-forward"
    assert points.split_ints("1 2 3") == [1, 2, 3] and points.split_ints(float("nan")) == []


def test_threads_auto_takes_the_cores_available_shares_them_and_is_recorded(monkeypatch):
    import os

    from earlyexit.book.provenance import threads_record
    from earlyexit.engine.threads import available_cores, resolve_threads

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("EARLYEXIT_WORLD", raising=False)
    monkeypatch.setenv("EARLYEXIT_IGNORE_LOAD", "1")      # the test machine's own load is not the point here
    cores = available_cores()
    assert 1 <= cores <= len(os.sched_getaffinity(0))
    assert resolve_threads("auto")[0] == cores
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert available_cores() == 1, "a scheduler's grant caps the cores"
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    n, why = resolve_threads("auto")
    assert n == max(1, cores // 2) and "shared by 2 processes" in why
    assert resolve_threads(3) == (3, "given")
    for bad in ("many", -1, 1.5, True):
        with pytest.raises(ValueError, match="'auto', 0"):
            resolve_threads(bad)
    rec = threads_record("auto")
    assert rec["torch_num_threads"] == torch.get_num_threads() and rec["why"].startswith("auto: ")


def test_threads_auto_leaves_out_the_cores_other_processes_keep_busy(monkeypatch):
    import multiprocessing as mp
    import os

    from earlyexit.engine import threads as models
    from earlyexit.engine.threads import busy_cores, resolve_threads

    cpus = sorted(os.sched_getaffinity(0))
    # /proc/stat as two readings 0.3 s apart: every CPU of the affinity one third busy in between, by others
    def fake(busy_per_cpu):
        calls = iter([0, 1])

        def read():
            k = next(calls)
            lines = ["cpu  0 0 0 0 0 0 0 0"]
            for c in cpus:
                b = k * busy_per_cpu
                lines.append(f"cpu{c} {b} 0 0 {k * (30 - busy_per_cpu)} 0 0 0 0")
            return "\n".join(lines) + "\n"
        return read

    assert busy_cores(0.01, read=fake(10)) == pytest.approx(len(cpus) / 3, abs=0.15)
    assert busy_cores(0.01, read=fake(0)) == 0.0
    assert busy_cores(0.01, read=lambda: (_ for _ in ()).throw(OSError("no /proc"))) == 0.0
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("EARLYEXIT_WORLD", raising=False)
    monkeypatch.delenv("EARLYEXIT_IGNORE_LOAD", raising=False)
    monkeypatch.setattr(models, "available_cores", lambda: 4)
    monkeypatch.setattr(models, "busy_cores", lambda: 1.2)
    assert resolve_threads("auto") == (3, "auto: 4 cores available, 1.2 kept busy by other processes")
    monkeypatch.setattr(models, "busy_cores", lambda: 9.0)
    assert resolve_threads("auto")[0] == 1, "at least one thread"
    monkeypatch.setenv("EARLYEXIT_IGNORE_LOAD", "1")
    assert resolve_threads("auto") == (4, "auto: 4 cores available")
    monkeypatch.delenv("EARLYEXIT_IGNORE_LOAD")
    monkeypatch.setenv("EARLYEXIT_WORLD", "2")          # sweep workers: their own load is not others' work
    assert resolve_threads("auto") == (2, "auto: 4 cores available, shared by 2 processes")
    # and for real: a process spinning on one core is seen
    if len(cpus) >= 2:
        stop = mp.Event()
        hog = mp.Process(target=_spin, args=(stop,), daemon=True)
        hog.start()
        try:
            import time
            time.sleep(0.3)
            assert busy_cores(0.5) >= 0.6
        finally:
            stop.set()
            hog.join()


def _spin(stop):
    x = 0
    while not stop.is_set():
        x += 1


def test_time_replay_uses_the_recorded_exits(lm, es):
    sub = es.subset(2)
    df = points.point(lm, sub, 6, EE("scripted", exits=(6, 2, 6, 3)))
    t = timing.time_replay(lm, sub, 6, df, "eager-recompute", repeats=1)
    assert len(t) == 2 and (t["tok_s"] > 0).all()
    assert np.allclose(t["layers"], lm.num_layers)          # eager runs every skipped layer at once
    t2 = timing.time_replay(lm, sub, 6, df, "naive-mask", repeats=1)
    assert (t2["layers"] < lm.num_layers).all()

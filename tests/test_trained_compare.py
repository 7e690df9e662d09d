"""trained.py (checkpoints keyed by their recipe) and compare.py (the comparison chapter's tables)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from earlyexit import paths
from earlyexit.chapters import quoted
from earlyexit.experiments import compare, metrics
from earlyexit.book import handoff, params
from earlyexit.experiments import points, evalset
from earlyexit.training import checkpoints as tr
from earlyexit.experiments import trained
from earlyexit.engine import DecodeConfig
from earlyexit.training import classifier as train_clf
from earlyexit.training.recipe import TrainConfig

N = 6


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.getbasetemp() / "cache"
    monkeypatch.setattr(paths, "CACHE", root)
    return root


def small(**kw):
    base = dict(steps=3, batch_size=2, seq_len=16, warmup=1, curriculum_param=2, checkpoint_every=1)
    return TrainConfig(**{**base, **kw})


# ---------------------------------------------------------------------------------------- trained.py

def test_key_depends_on_what_changes_the_weights_only():
    r = tr.Recipe("tiny-llama", small())
    assert r.key() == tr.Recipe("tiny-llama", small()).key()
    # checkpoint cadence does not change the weights, so not the key
    assert r.key() == tr.Recipe("tiny-llama", small(checkpoint_every=7, keep_checkpoints=3)).key()
    others = [tr.Recipe("tiny-llama", small(lr=2e-4)), tr.Recipe("tiny-llama", small(recipe=False)),
              tr.Recipe("tiny-llama", small(p_max=0.2)), tr.Recipe("tiny-llama", small(), data_seed=1),
              tr.Recipe("tiny-qwen2", small()), tr.Recipe("scratch:llama-4x64", small())]
    keys = {o.key() for o in others}
    assert r.key() not in keys and len(keys) == len(others)
    assert r.directory().parent == tr.CHECKPOINTS
    assert r.directory().name.startswith("tiny-llama-layerskip-")


def test_bad_recipes_fail_before_any_work():
    with pytest.raises(ValueError, match="unknown scratch config 'nope'.*scratch:llama-8x64"):
        tr.Recipe("scratch:nope", small())
    with pytest.raises(TypeError, match="TrainConfig"):
        tr.Recipe("tiny-llama", {"steps": 3})
    with pytest.raises(ValueError, match=r"p_max must be in \[0, 1\)"):
        small(p_max=1.0)
    with pytest.raises(ValueError, match="unknown curriculum 'spiral'; valid: none, rotational, gradual"):
        small(curriculum="spiral")


def test_batches_are_deterministic_in_any_order():
    from earlyexit.engine.models import embedded_tokenizer

    tok = embedded_tokenizer()
    a, b = tr.Batches(tok, 2, 16, seed=0), tr.Batches(tok, 2, 16, seed=0)
    late_first = b(3)
    assert torch.equal(a(0), b(0)) and torch.equal(a(3), late_first)
    assert a(1).shape == (2, 16) and a(1).dtype == torch.long
    assert not torch.equal(a(1), a(2))


def test_ensure_trains_once_then_reuses_and_load_gives_those_weights(tmp_path):
    r = tr.Recipe("tiny-llama", small())
    run = tr.ensure(r, root=tmp_path, progress=False)
    assert run.trained_now and run.checkpoint.name == "step_00000003"
    assert len(run.history["step"]) == 3 and tr.is_complete(r, tmp_path)
    meta = json.loads((run.checkpoint.parent / "recipe.json").read_text())
    assert meta["key"] == r.key()
    again = tr.ensure(r, root=tmp_path, progress=False)
    assert not again.trained_now and again.history["loss"] == run.history["loss"]
    lm = tr.load(r, device="cpu", root=tmp_path)
    from earlyexit.engine.models import load_model

    base = load_model("tiny-llama")
    changed = [k for k, v in lm.model.state_dict().items() if not torch.equal(v, base.model.state_dict()[k])]
    assert changed, "the trained weights must differ from the base model's"
    assert lm.weights_sha256 != base.weights_sha256 and lm.extra["train_key"] == r.key()
    assert tr.history_frame(run)["step"].tolist() == [1, 2, 3]


ENSURE_RACE = """
import json, os, pathlib, sys, time
from earlyexit.training import checkpoints as tr
from earlyexit.training.recipe import TrainConfig
up = pathlib.Path(sys.argv[2]); up.mkdir(exist_ok=True); (up / str(os.getpid())).touch()
while len(list(up.iterdir())) < 2:
    time.sleep(0.001)
r = tr.Recipe("tiny-llama", TrainConfig(steps=6, batch_size=2, seq_len=16, warmup=1, curriculum_param=2,
                                        checkpoint_every=1))
run = tr.ensure(r, root=pathlib.Path(sys.argv[1]), progress=False)
print(json.dumps({"trained_now": run.trained_now, "loss": run.history["loss"], "ck": run.checkpoint.name}))
"""


def test_two_processes_that_need_one_checkpoint_train_it_once(tmp_path):
    """Two chapters run at once both need chapter 6's checkpoint: one trains it under a claim, the other waits
    and reads the same run (without the claim both would train into one folder)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "EARLYEXIT_PROGRESS": "0"}
    procs = [subprocess.Popen([sys.executable, "-c", ENSURE_RACE, str(tmp_path / "ck"), str(tmp_path / "up")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(o["trained_now"] for o in outs) == [False, True]
    assert outs[0]["loss"] == outs[1]["loss"] and outs[0]["ck"] == outs[1]["ck"] == "step_00000006"
    assert not list((tmp_path / "ck").glob("*.claim")), "the claim is released"


def test_kept_weights_along_the_run_load_as_they_were_at_each_step(tmp_path):
    r = tr.Recipe("tiny-llama", small(steps=4, checkpoint_every=1, keep_checkpoints=1, keep_weights=True))
    assert r.key() == tr.Recipe("tiny-llama", small(steps=4, checkpoint_every=1, keep_checkpoints=1)).key()
    tr.ensure(r, root=tmp_path, progress=False)
    snaps = tr.snapshots(r, tmp_path)
    assert list(snaps) == [1, 2, 3, 4]
    # only the newest keeps its optimizer state (it alone can be resumed); the older ones keep their weights
    assert [(p / "train_state.pt").exists() for p in snaps.values()] == [False, False, False, True]
    # step 2's weights are those of the same run stopped after its second step
    from earlyexit.training.loop import latest_checkpoint, load_checkpoint_weights

    train_stopped_at(r, tmp_path / "stopped", 2)
    stopped = tr._base_loaded(r).model
    load_checkpoint_weights(stopped, latest_checkpoint(tmp_path / "stopped"))
    at2 = tr.load(r, device="cpu", root=tmp_path, step=2).model.state_dict()
    assert all(torch.equal(at2[k], v) for k, v in stopped.state_dict().items())
    at4 = tr.load(r, device="cpu", root=tmp_path, step=4).model.state_dict()
    last = tr.load(r, device="cpu", root=tmp_path).model.state_dict()
    assert all(torch.equal(at4[k], last[k]) for k in last)
    assert any(not torch.equal(at2[k], last[k]) for k in last)
    with pytest.raises(ValueError, match="kept: 1, 2, 3, 4"):
        tr.load(r, device="cpu", root=tmp_path, step=7)
    # without keep_weights only the newest checkpoint stays
    plain = tr.Recipe("tiny-llama", small(steps=3, checkpoint_every=1, keep_checkpoints=1))
    tr.ensure(plain, root=tmp_path / "plain", progress=False)
    assert list(tr.snapshots(plain, tmp_path / "plain")) == [3]


def train_stopped_at(recipe, checkpoint_dir, step: int) -> None:
    """Train ``recipe`` into ``checkpoint_dir`` as if killed when asked for the batch of ``step`` (0-based): the
    checkpoints written before it stay behind."""
    from earlyexit.training.loop import train

    class Stop(Exception):
        pass

    lm0 = tr._base_loaded(recipe)
    batches = tr.Batches(lm0.tokenizer, recipe.cfg.batch_size, recipe.cfg.seq_len, recipe.data_seed)

    def until(s):
        if s >= step:
            raise Stop
        return batches(s)

    with pytest.raises(Stop):
        train(lm0.model, until, recipe.cfg, checkpoint_dir=checkpoint_dir, progress=False)


def test_load_without_training_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m earlyexit train --profile"):
        tr.load(tr.Recipe("tiny-llama", small()), root=tmp_path, train_if_missing=False)


def test_interrupted_training_resumes_to_the_same_weights(tmp_path):
    r = tr.Recipe("tiny-llama", small(steps=4, checkpoint_every=2))
    straight = tr.ensure(r, root=tmp_path / "a", progress=False)
    # an interrupted run: the 4-step recipe killed during step 3 leaves its step-2 checkpoint behind
    train_stopped_at(r, r.directory(tmp_path / "b"), 2)
    assert not tr.is_complete(r, tmp_path / "b")
    resumed = tr.ensure(r, root=tmp_path / "b", progress=False)
    assert resumed.trained_now and tr.is_complete(r, tmp_path / "b")
    a = tr.load(r, device="cpu", root=tmp_path / "a").model.state_dict()
    b = tr.load(r, device="cpu", root=tmp_path / "b").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.history["loss"] == straight.history["loss"]


def test_recipes_follow_chapter_six_parameters(monkeypatch):
    monkeypatch.setattr(trained, "native_bf16", lambda: True)   # a CPU with BF16 instructions
    p = params.validate(params.get("06_training"), {"model": "tiny-llama", "steps": 5, "scratch_steps": 7})
    rs = trained.recipes(p)
    assert set(rs) == {"layerskip", "baseline", "distill", "light", "scratch-baseline", "scratch-layerskip"}
    assert rs["layerskip"].base == "tiny-llama" and rs["layerskip"].cfg.steps == 5
    # the continual variants differ from LayerSkip's run only in what they vary, and keep their weights
    ls = rs["layerskip"].cfg
    assert rs["baseline"].cfg == replace(ls, recipe=False) and rs["distill"].cfg == replace(ls, exit_target="distill")
    assert rs["light"].cfg == replace(ls, p_max=p["light_p_max"], e_scale=p["light_e_scale"])
    assert (rs["light"].cfg.p_max, rs["light"].cfg.e_scale) != (ls.p_max, ls.e_scale)
    lighter = trained.recipes({**p, "light_p_max": 0.02, "light_e_scale": 0.01})["light"].cfg
    assert (lighter.p_max, lighter.e_scale) == (0.02, 0.01)
    assert all(rs[k].cfg.keep_weights for k in ("layerskip", "baseline", "distill", "light"))
    assert len({rs[k].directory() for k in ("layerskip", "baseline", "distill", "light")}) == 4
    assert list(trained.continual(rs)) == ["layerskip", "baseline", "distill", "light"]
    assert rs["distill"].label().endswith("-distill") and rs["baseline"].label().endswith("-baseline")
    assert set(trained.recipes({**p, "variants": []})) == {"layerskip", "scratch-baseline", "scratch-layerskip"}
    with pytest.raises(ValueError, match="valid: baseline, distill, light"):
        trained.recipes({**p, "variants": ["distil"]})
    b, s = rs["scratch-baseline"], rs["scratch-layerskip"]
    assert (b.cfg.recipe, s.cfg.recipe) == (False, True)
    assert replace(b.cfg, recipe=True) == s.cfg and b.base == s.base and b.data_seed == s.data_seed
    assert not ls.amp_cpu and not rs["scratch-layerskip"].cfg.amp_cpu
    amp = trained.recipes({**p, "amp_cpu": True})
    assert all(amp[k].cfg == replace(rs[k].cfg, amp_cpu=True) for k in ("layerskip", "baseline", "distill", "light"))
    assert amp["scratch-layerskip"].cfg == s.cfg, "the from-scratch pair keeps float32"
    assert amp["layerskip"].key() != rs["layerskip"].key()
    assert trained.precision(ls, "cpu") == "float32" and trained.precision(amp["layerskip"].cfg, "cpu").startswith("bfloat16")
    assert trained.precision(ls, "cuda").startswith("bfloat16"), "amp (on CUDA) is on by default"
    smoke = handoff.recipes("smoke")
    assert smoke["layerskip"].base == "tiny-llama"
    with pytest.raises(ValueError, match="trains 'tiny-llama' in chapter 6, not 'smollm2-135m'"):
        handoff.recipes("smoke", model="smollm2-135m")


def test_a_cpu_without_bf16_instructions_trains_in_float32_and_the_page_says_why(monkeypatch):
    """Autocast on a CPU without AVX-512 BF16 or AMX is emulated (on a 2-core AVX2 EPYC a step took 12 times the
    float32 one): asking for it there gives the float32 recipe, whose key is the float32 run's, and the page's
    precision sentence names what was asked and why it did not run."""
    p = params.validate(params.get("06_training"), {"model": "tiny-llama", "steps": 5, "scratch_steps": 7})
    monkeypatch.setattr(trained, "native_bf16", lambda: False)
    asked, plain = trained.recipes({**p, "amp_cpu": True}), trained.recipes({**p, "amp_cpu": False})
    assert all(asked[k].key() == plain[k].key() and not asked[k].cfg.amp_cpu for k in asked)
    words = trained.precision(asked["layerskip"].cfg, "cpu", asked=True)
    assert words.startswith("float32 (") and "AVX-512 BF16 or AMX" in words
    assert trained.precision(asked["layerskip"].cfg, "cuda", asked=True).startswith("bfloat16"), "CUDA autocasts"


def test_native_bf16_reads_the_cpu_flags():
    from earlyexit.training.recipe import native_bf16

    flags = set()
    try:
        flags = set(next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split())
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags to compare with")
    assert native_bf16() == bool(flags & {"avx512_bf16", "amx_bf16"})


def test_layer_agreement_last_layer_agrees_with_itself():
    from earlyexit.engine.models import load_model

    lm = load_model("tiny-llama")
    df = trained.layer_agreement(lm, 2, 24)
    assert sorted(df["layer"].unique()) == list(range(1, lm.num_layers + 1))
    last = df[df.layer == lm.num_layers]
    assert np.allclose(last["agreement"], 1.0) and (df["tokens"] == 23).all()


# ---------------------------------------------------------------------------------------- compare.py

def test_scale_layers():
    assert compare.scale_layers([15, 20, 25], 30, 6, 1, 5) == [3, 4, 5]
    assert compare.scale_layers([20, 25, 28], 30, 4) == [3, 4]
    assert compare.scale_layers([1, 2], 30, 8, 2) == [2]


def _summ(rows):
    df = pd.DataFrame(rows, columns=["method", "label", "layers", "consistency", "speed"])
    for c in ("layers", "consistency", "speed"):
        df[f"{c}_lo"], df[f"{c}_hi"] = df[c] - 0.01, df[c] + 0.01
    return df


def test_best_at_picks_the_cheapest_point_that_reaches_the_target():
    s = _summ([("a", "a1", 10, 0.97, 1.2), ("a", "a2", 20, 0.99, 1.0), ("a", "a3", 5, 0.90, 1.5),
               ("b", "b1", 8, 0.80, 1.3), ("b", "b2", 12, 0.85, 1.1)])
    best = compare.best_at(s, 0.95).set_index("method")
    assert best.loc["a", "label"] == "a1" and best.loc["a", "meets"]
    # none of b reaches it: its most consistent point, flagged
    assert best.loc["b", "label"] == "b2" and not best.loc["b", "meets"]
    t = compare.table(best.reset_index())
    assert list(t["reaches target"]) == ["yes", "no"] and t.loc[0, "consistency"] == "0.97 [0.96, 0.98]"


def test_pareto_front_drops_dominated_points():
    s = _summ([("a", "p", 10, 0.9, 1), ("a", "q", 12, 0.8, 1), ("a", "r", 15, 0.95, 1), ("a", "s", 5, 0.5, 1)])
    assert compare.pareto_front(s)["label"].tolist() == ["s", "p", "r"]


@pytest.fixture(scope="module")
def tiny():
    from earlyexit.engine.models import load_model

    lm = load_model("tiny-llama")
    return lm, evalset.eval_set(lm, "mix", 4, 0, 48)


def test_error_split_parts_add_up_and_exact_caches_have_no_cache_part(tiny, cache_dir):
    lm, es = tiny
    split = compare.error_split(lm, es, N, rule="softmax", threshold=0.3, min_layer=2, n_boot=200)
    w = split.pivot(index="strategy", columns="part", values="mean")
    assert np.allclose(w["exit_decision"] + w["cache"] + w["interaction"], w["total"])
    assert np.allclose(w.loc[["lazy-recompute", "eager-recompute"], "cache"], 0.0)
    assert np.allclose(w.loc["lazy-recompute", "total"], w.loc["lazy-recompute", "exit_decision"])


@pytest.fixture
def units(tiny, cache_dir):
    from earlyexit.experiments import costmodel

    return costmodel.measure_units(tiny[0], ctx=16, shortlist=64, repeats=1, n_steps=4)


def test_method_points_cover_every_method_and_self_speculation_is_exact(tiny, cache_dir, units):
    lm, es = tiny
    cfg = train_clf.ClassifierConfig(n_prompts=3, n_new=4, max_prompt_tokens=24, min_layer=3, hidden=8, epochs=2,
                                     batch_size=16)
    folder = str(train_clf.ensure(lm, cfg, root=cache_dir / "clf"))
    pts = compare.method_points(lm, es, N, units=units, rule="softmax", thresholds=[0.3, 0.9], min_layer=3,
                                static_layers=[3, 5], e_mins=[3], spec=[(3, 2)], spec_set=es.subset(2),
                                classifier=folder, classifier_thresholds=[0.5])
    assert set(pts["method"]) == set(compare.METHODS)
    # without a classifier the classifier methods are absent, not empty rows
    plain = compare.method_points(lm, es, N, units=units, rule="softmax", thresholds=[0.9], min_layer=3, static_layers=[3],
                                  e_mins=[3], spec=[(3, 2)], spec_set=es.subset(2))
    assert set(plain["method"]) == set(compare.METHODS) - set(compare.CLASSIFIED)
    spec = pts[pts.method == "self-speculation"]
    assert (spec["consistency"] == 1.0).all() and (spec["exact_match"] == 1.0).all()
    orc = pts[pts.method == "oracle exits"]
    assert (orc["consistency"] == 1.0).all()
    # speeds are the cost model's: fewer layers predict a faster run, and no timing noise enters
    static = pts[pts.method == "static exit"].groupby("label")["speed"].first()
    assert static["static@3"] > static["static@5"] > 1.0
    again = compare.method_points(lm, es, N, units=units, rule="softmax", thresholds=[0.9], min_layer=3,
                                  static_layers=[3], e_mins=[3], spec=[(3, 2)], spec_set=es.subset(2))
    pd.testing.assert_series_equal(again["speed"], plain["speed"])
    # self-speculation's layers count decoding steps only, like the other methods: at most L per draft
    # token plus the verification, never the prompt pass
    assert (spec["layers"] < 2 * lm.num_layers * 3).all() and (spec["layers"] > 0).all()


def test_chapter_sevens_drafters_in_the_table_are_lossless_and_read_back_from_the_cache(tiny, cache_dir, monkeypatch,
                                                                                       units):
    lm, es = tiny
    sset = es.subset(2)
    L = lm.num_layers
    p7 = {"shortlist": 64, "draft_confidence": 0.5, "skip_layers": [1, 2], "skip_draft_lens": [1, 2],
          "skip_blocks": 2, "skip_block_tokens": 16, "seed": 0}
    pts = compare.drafter_points(lm, sset, N, [(2, 2), (3, 2), (3, 3)], p7, L, units, plain=True)
    assert set(pts["method"]) == {"self-speculation", *compare.DRAFTERS}
    # the layer-skip drafter runs at chapter 7's draft lengths over the shortlist head, as chapter 7 runs it: one
    # point per skip count and d
    skip_pts = pts[pts.method == "layer-skip drafter"]
    assert len(skip_pts) == 2 * 2 * len(sset) and skip_pts["label"].nunique() == 4
    assert skip_pts["label"].str.contains("K=64").all()
    assert (pts["consistency"] == 1.0).all() and (pts["exact_match"] == 1.0).all(), "every drafter is lossless"
    assert pts[pts.method == "layer-skip drafter"]["label"].str.contains("skip 2 layers").any()
    assert pts[pts.method == "self-speculation, shortlist"]["label"].str.contains("K=64").all()
    assert len(compare.drafter_points(lm, sset, N, [(2, 2), (3, 2), (3, 3)], p7, L, units)) == len(pts) - 3 * len(sset)
    # a second call times nothing: chapter 8 reads chapter 7's points
    from earlyexit.experiments import timing
    monkeypatch.setattr(timing, "best_of", lambda *a, **k: pytest.fail("timed again"))
    again = compare.drafter_points(lm, sset, N, [(2, 2), (3, 2), (3, 3)], p7, L, units, plain=True)
    pd.testing.assert_frame_equal(again, pts)
    summ = compare.summarize(pts.assign(model="m"), n_boot=100, by=("model", "method", "label"))
    top = quoted.named_drafters(summ, summ[summ.method != "self-speculation"], pts.assign(model="m"))
    assert top.loc["m", "speed"] >= (1 - quoted.RANK_TOL) * summ["speed"].max(), "named within the band of the fastest"
    tab = compare.wide_table(compare.best_at(summ, 0.95, by=("model", "method")), {"m": "M"}, {"m": L})
    assert tab["method"].tolist() == ["self-speculation", *compare.DRAFTERS]


def test_never_exits_marks_only_a_rule_that_kept_the_full_model_at_full_depth():
    best = pd.DataFrame({"model": "m", "method": ["naive-mask", "lazy-recompute", "copy-forward"],
                         "label": ["a", "b", "c"], "layers": [8.0, 8.0, 5.0], "consistency": [1.0, 0.76, 1.0],
                         "speed": [0.9, 0.5, 1.1], "meets": [True, False, True]})
    cells = compare.wide_table(best, {"m": "M"}, {"m": 8}).set_index("method")["M"]
    assert "(never exits)" in cells["naive-mask"]
    assert "never" not in cells["lazy-recompute"], "it exits and recomputes: about L layers, output changed"
    assert "never" not in cells["copy-forward"]


def test_calibration_accepts_never_exiting_and_checks_on_the_test_half(tiny, cache_dir, units):
    lm, _ = tiny
    s = evalset.eval_set(lm, "mix", 8, 1, 48)
    cal, test = s.part(0, 4), s.part(4, 8)
    assert cal.spec != test.spec and cal.ids == s.ids[:4]
    lam, det, res = compare.calibrate(lm, cal, test, N, rule="softmax", strategy="lazy-recompute",
                                      thresholds=[0.9, 0.3], min_layer=2, epsilon=0.6, delta=0.2, units=units)
    tested = det["threshold"].tolist()
    assert tested == [1.0, 0.9, 0.3][:len(tested)]
    # fixed-sequence testing: every λ before the last tested was accepted, and it stops at the first that is not
    assert det["accepted"].iloc[:-1].all() and (len(tested) == 3 or not det["accepted"].iloc[-1])
    # lambda = 1 never exits: zero loss on every prompt, so it is rejected as "risky" only if n is tiny
    assert det.loc[0, "risk_hat"] == 0.0
    p0 = metrics.hoeffding_bentkus_pvalue(0.0, 4, 0.6)
    assert np.isclose(det.loc[0, "p_value"], p0) and bool(det.loc[0, "accepted"]) == (p0 <= 0.2)
    if lam is not None:
        assert res is not None and {"consistency", "risk", "layers", "speed"} <= set(res.columns)
    with pytest.raises(ValueError, match="outside the 8 prompts"):
        s.part(4, 9)


def test_calibration_runs_no_threshold_after_the_first_it_cannot_reject(tiny, cache_dir, monkeypatch, units):
    lm, _ = tiny
    s = evalset.eval_set(lm, "mix", 8, 1, 48)
    cal, test = s.part(0, 4), s.part(4, 8)
    ran = []
    sweep = points.sweep
    monkeypatch.setattr(points, "sweep", lambda lm_, es, n, cfgs, **kw: (ran.extend(c.args["threshold"] for c in cfgs),
                                                                       sweep(lm_, es, n, cfgs, **kw))[1])
    # ε = 0.05 on 4 prompts: even a perfect loss leaves the p-value above δ, so λ = 1 is not rejected
    assert metrics.hoeffding_bentkus_pvalue(0.0, 4, 0.05) > 0.2
    lam, det, res = compare.calibrate(lm, cal, test, N, rule="softmax", strategy="lazy-recompute",
                                      thresholds=[0.9, 0.3], min_layer=2, epsilon=0.05, delta=0.2, units=units)
    assert lam is None and res is None
    assert det["threshold"].tolist() == [1.0] and ran == [1.0]


def test_front_page_runs_last_because_it_summarises_the_chapters():
    from earlyexit.book import runner

    assert runner.toc_root() == "00_intro"
    assert runner.execution_order(["00_intro", "01_a", "08_c"], "00_intro") == ["01_a", "08_c", "00_intro"]
    assert runner.execution_order(["01_a"], "00_intro") == ["01_a"]
    names = runner.toc_notebooks()
    assert names[0] == "00_intro" and "08_comparison" in names


def test_train_command_lists_the_profile_checkpoints(monkeypatch, capsys):
    """`python -m earlyexit train --profile smoke` builds what chapter 6 trains under the profile (here with
    the training replaced by a stand-in, so the test checks the wiring, not the minutes)."""
    from earlyexit.__main__ import main
    from earlyexit.training import checkpoints

    seen = []

    def fake_ensure(recipe, device="cpu", **kw):
        seen.append(recipe.label())
        return checkpoints.Run(recipe, paths.DATA / "x", {"step": [0], "seconds": [0.0]}, False)

    monkeypatch.setattr(checkpoints, "ensure", fake_ensure)
    assert main(["train", "--profile", "smoke"]) == 0
    assert len(seen) == 6 and any("layerskip" in s for s in seen) and any("distill" in s for s in seen)
    assert main(["train", "--profile", "nope"]) == 2

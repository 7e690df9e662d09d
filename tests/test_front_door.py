"""The front door gives, for every method, the tokens and counters the engine gave before it existed.

``tests/data/front_door_golden.json.gz`` was recorded at commit 5eacdbc, before the engine was rebuilt
around ``decode(lm, prompts, DecodeConfig, N)``, with that commit's ``earlyexit.decode.generate`` and
``earlyexit.speculative.self_speculative`` (torch 2.13.0, CPU, one thread), on four fixed prompts of the
book's "mix" set: every exit rule with every fill strategy, the oracle, SkipDecode, a scripted exit pattern
(with the hole-weight audit once), decoding past EOS, and self-speculation at two (E, d) per prompt. Each
run here must give the same tokens, exit layers, counters (layers run, recompute, copies, head
evaluations, hole reads, and the hole weight, a float probe whose last bits follow the CPU's kernels, to a
relative 1e-5), provenance map (its SHA-256), column exits and pending work.
"""
import gzip
import hashlib
import json
from pathlib import Path

import pytest
import torch

from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.models import load_model

GOLDEN = json.loads(gzip.open(Path(__file__).parent / "data" / "front_door_golden.json.gz", "rt").read())
STRATS = ("naive-mask", "naive-undefined", "copy-forward", "lazy-recompute", "eager-recompute")
OLD_COUNTERS = ("layers_run", "recompute_layers", "copied_kv", "head_checks", "hole_reads", "hole_weight")


def configs(g, L):
    """The runs recorded for one model: name -> (DecodeConfig, decode keyword arguments)."""
    mins, thr, script = g["min_layer"], g["thresholds"], tuple(g["script"])
    E = DecodeConfig.early_exit
    out = {"full": (E("full"), {}), "static": (E("static", layer=L - 2), {})}
    for rule in ("softmax", "margin", "saturation"):
        for t in (thr if rule != "saturation" else (0.9,)):
            for s in STRATS:
                out[f"{rule}:{t}:{s}"] = (E(rule, s, threshold=t, min_layer=mins), {})
    for s in STRATS:
        out[f"oracle:{s}"] = (E("oracle", s, min_layer=mins), {})
        out[f"scripted:{s}"] = (E("scripted", s, exits=script), {})
    out["skipdecode"] = (E("skipdecode", e_max=L, e_min=max(2, L // 2), horizon=g["n_new"], warmup=1), {})
    out["audit:naive-undefined"] = (E("scripted", "naive-undefined", exits=script), {"audit_weights": True})
    out["nostop:softmax"] = (E("softmax", "copy-forward", threshold=thr[0], min_layer=mins), {"stop_at_eos": False})
    return out


def check_model(spec):
    torch.set_num_threads(1)
    g = GOLDEN["models"][spec]
    lm = load_model(spec, device="cpu")
    L, ids, n = lm.num_layers, g["prompts"], g["n_new"]
    cfgs = configs(g, L)
    assert set(cfgs) == set(g["runs"])
    for name, (cfg, kw) in cfgs.items():
        want = g["runs"][name]
        r = decode(lm, ids, cfg, n, **kw)
        assert r.tokens.tolist() == want["tokens"], name
        assert r.n_new.tolist() == want["n_new"], name
        assert r.exit_layer.tolist() == want["exits"], name
        for c in OLD_COUNTERS:
            if c == "hole_weight":  # a float probe (softmax mass): its last bits follow the CPU's kernels
                got = r.counts[c].flatten().tolist()
                assert got == pytest.approx(sum(want["counts"][c], []), rel=1e-5, abs=1e-7), (name, c)
            else:
                assert r.counts[c].tolist() == want["counts"][c], (name, c)
        assert hashlib.sha256(r.state.numpy().tobytes()).hexdigest() == want["state_sha"], name
        assert r.col_exit.tolist() == want["col_exit"], name
        if "pending" in want:
            assert r.pending.tolist() == want["pending"], name
    for key, want in g["spec"].items():
        E, d, b = map(int, key.split(":"))
        r = decode(lm, ids[b], DecodeConfig.self_speculation(E, d), n, stop_at_eos=False)
        assert r.sequences()[0] == want["tokens"], key
        assert int(r.rounds[0]) == want["rounds"], key
        assert int(r.counts["drafted"].sum()) == want["drafted"], key
        assert int(r.counts["accepted"].sum()) == want["accepted"], key
        assert len(ids[b]) * L + int(r.counts["layers_run"][0, 1:].sum()) == want["layer_evals"], key
        assert 1 + int(r.counts["head_checks"][0, 1:].sum()) == want["head_evals"], key


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-qwen2"])
def test_front_door_reproduces_the_engine_before_it(spec):
    check_model(spec)


@pytest.mark.embedded
def test_front_door_reproduces_the_engine_before_it_on_the_embedded_model():
    check_model("smollm2-135m")


def test_config_label_key_and_errors():
    c = DecodeConfig.early_exit("softmax", "copy-forward", threshold=0.9, min_layer=15)
    assert c.label == "softmax 0.9 / copy-forward"
    assert c.key() == {"rule": "softmax", "strategy": "copy-forward", "rule_kw": {"min_layer": 15, "threshold": 0.9}}
    assert c == DecodeConfig.early_exit("softmax", "copy-forward", min_layer=15, threshold=0.9)
    assert hash(c) == hash(DecodeConfig.early_exit("softmax", "copy-forward", min_layer=15, threshold=0.9))
    assert c.replace(threshold=0.99).threshold == 0.99
    assert DecodeConfig.early_exit("scripted", exits=[3, 4]).args["exits"] == (3, 4)
    assert DecodeConfig.early_exit("static", layer=20).label == "static@20"
    assert DecodeConfig.self_speculation(25, 2).label == "self-spec E=25 d=2"
    with pytest.raises(ValueError, match="valid: full, static"):
        DecodeConfig.early_exit("softmx")
    with pytest.raises(ValueError, match="valid: naive-mask"):
        DecodeConfig.early_exit("softmax", "copy")
    with pytest.raises(ValueError, match="draft_len"):
        DecodeConfig.self_speculation(3, 0)
    with pytest.raises(TypeError, match=r"DecodeConfig.early_exit\(\.\.\.\), \.full\(\), \.self_speculation"):
        DecodeConfig()
    with pytest.raises(ValueError, match="unknown drafting option.*valid: shortlist, confidence, skip"):
        DecodeConfig.self_speculation(3, 2, shortlst=8)
    with pytest.raises(ValueError, match="hf-assistant takes no drafting options"):
        DecodeConfig.hf_assistant(3, 2, shortlist=8)


def test_decode_checks_before_compute():
    from earlyexit.engine.models import tiny_model

    m = tiny_model("tiny-llama")
    with pytest.raises(ValueError, match="must be a DecodeConfig"):
        decode(m, [[5, 6]], "full", 4)
    with pytest.raises(ValueError, match="takes"):
        decode(m, [[5, 6]], DecodeConfig.early_exit("softmax", threshold=0.5, layer=3), 4)
    with pytest.raises(ValueError, match="exit_layer E must be an int in"):
        decode(m, [[5, 6]], DecodeConfig.self_speculation(6, 2), 4)
    with pytest.raises(ValueError, match="apply to early-exit decoding only"):
        decode(m, [[5, 6]], DecodeConfig.self_speculation(2, 2), 4, return_kv=True)
    with pytest.raises(ValueError, match="context"):
        decode(m, [[5] * 2040], DecodeConfig.full(), 16)


def test_the_recorded_build_before_the_change_can_be_compared_with(tmp_path):
    """scripts/compare-glued reads the glued values recorded from the cpu build before the architecture change
    (chapters 2-8) and compares a build's executed chapters with them; a chapter not executed is named."""
    import json
    import subprocess
    import sys

    nb = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "display_data", "metadata": {"scrapbook": {"name": "n_prompts", "mime_prefix": "x/"}},
         "data": {"x/text/plain": "12"}},
        {"output_type": "display_data", "metadata": {"scrapbook": {"name": "tps_full", "mime_prefix": "x/"}},
         "data": {"x/text/plain": "1.0"}}]}]}
    (tmp_path / "04_lazy_recompute.ipynb").write_text(json.dumps(nb))
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "scripts/compare-glued"), "--generated", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "02_naive_collapse: not executed here" in out
    assert "04_lazy_recompute: 2 common, 1 identical, 1 differ (timing), 0 differ (other)" in out

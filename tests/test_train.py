"""Tests of the LayerSkip training recipe (earlyexit.training.loop) on tiny seeded models."""
from __future__ import annotations

import json
import math

import pytest
import torch

from earlyexit.training.forward import early_exit_loss, exit_logits, forward_layers, per_layer_agreement
from earlyexit.training.loop import latest_checkpoint, train
from earlyexit.training.recipe import (SCALES, TrainConfig, curriculum_layers, exit_loss_weights,
                                       layer_dropout_rates, lr_at)

VOCAB = 256


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and do not stall when other jobs share the cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny(seed: int = 0, family: str = "llama", attn: str = "sdpa", layers: int = 4):
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, \
        Qwen2ForCausalLM

    C, M = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
            "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    cfg = C(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
            tie_word_embeddings=True)
    if family == "mistral":
        cfg.sliding_window = 6  # shorter than the test sequences, so the sliding mask matters
    torch.manual_seed(seed)
    model = M._from_config(cfg, attn_implementation=attn)
    with torch.no_grad():  # widen the init so predictions are not all alike
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5 if "embed" in name else 0.08)
    return model.eval()


def ids(batch=3, T=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, T), generator=g)


def blocks_fn(batch, T, seed=7):
    def blocks(step):
        g = torch.Generator().manual_seed(seed * 100003 + step)
        # a learnable pattern: token t+1 = (token t + 1) % 32, with random starts
        start = torch.randint(0, 32, (batch, 1), generator=g)
        return (start + torch.arange(T)) % 32

    return blocks


# ---------------------------------------------------------------------------------------------------- forward
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_own_forward_equals_hf_logits(family, attn):
    model = tiny(family=family, attn=attn)
    x = ids(T=20)
    with torch.no_grad():
        ref = model(x).logits
        hs = forward_layers(model, x)
        ours = exit_logits(model, hs[len(hs) - 1])
    assert (ours - ref).abs().max().item() < 1e-4


def test_forward_is_causal_with_dropout_on():
    model = tiny().train()
    x = ids(T=12)
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % VOCAB
    rates = torch.full((4,), 0.5)
    with torch.no_grad():
        a = forward_layers(model, x, drop_rates=rates, generator=torch.Generator().manual_seed(3))
        b = forward_layers(model, y, drop_rates=rates, generator=torch.Generator().manual_seed(3))
    for l in a:
        assert torch.equal(a[l][:, :-1], b[l][:, :-1])
        assert not torch.equal(a[l][:, -1], b[l][:, -1])


# ---------------------------------------------------------------------------------------------- layer dropout
def test_layer_dropout_rates_formula():
    L, p = 7, 0.2
    r = layer_dropout_rates(L, p)
    assert r[0] == 0 and math.isclose(float(r[-1]), p)
    for l in range(L):
        assert math.isclose(float(r[l]), p * (2 ** (l / (L - 1)) - 1), rel_tol=1e-12)
    assert torch.all(r[1:] > r[:-1])
    assert layer_dropout_rates(1, 0.5).tolist() == [0.0]
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        layer_dropout_rates(4, 1.0)


def _manual(model, x, kept_layers):
    """Reference: run only ``kept_layers`` with HF's own layer call on one sequence."""
    return forward_layers(model, x, drop_rates=torch.tensor([0.0 if l in kept_layers else 1.0
                                                             for l in range(4)]),
                          generator=torch.Generator())[3]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_layer_dropout_is_per_sample_identity(attn):
    model = tiny(attn=attn).train()
    x = ids(batch=6, T=10)
    rates = torch.tensor([0.0, 0.5, 0.5, 0.5])
    with torch.no_grad():
        out = forward_layers(model, x, drop_rates=rates, generator=torch.Generator().manual_seed(11))[3]
        # replay the draws: one torch.rand(B) per layer with a positive rate
        g = torch.Generator().manual_seed(11)
        keep = {l: torch.rand(6, generator=g) >= rates[l] for l in (1, 2, 3)}
        keep[0] = torch.ones(6, dtype=torch.bool)
        patterns = set()
        for b in range(6):
            kept = {l for l in range(4) if keep[l][b]}
            patterns.add(frozenset(kept))
            ref = _manual(model, x[b:b + 1], kept)
            assert (out[b:b + 1] - ref).abs().max().item() < 1e-5
    assert len(patterns) > 1  # sequences of one batch really did drop different layers


def test_dropped_layer_is_identity():
    model = tiny().train()
    x = ids(T=8)
    with torch.no_grad():
        hs = forward_layers(model, x, drop_rates=torch.tensor([0.0, 1.0, 0.0, 0.0]),
                            generator=torch.Generator())
    assert torch.equal(hs[1], hs[0])


def test_no_layer_dropout_in_eval_mode():
    model = tiny().eval()
    x = ids()
    with torch.no_grad():
        a = forward_layers(model, x, drop_rates=torch.full((4,), 0.9), generator=torch.Generator())
        b = forward_layers(model, x)
    for l in range(4):
        assert torch.equal(a[l], b[l])


# -------------------------------------------------------------------------------------------- exit loss weights
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("layers", [[0, 1, 2, 3], [1, 3], [3], [0, 2]])
@pytest.mark.parametrize("e_scale", [0.1, 1.0, 3.0])
def test_exit_weights_sum_to_one(scale, layers, e_scale):
    w = exit_loss_weights(layers, 4, scale, e_scale)
    assert len(w) == len(layers) and math.isclose(float(w.sum()), 1.0, rel_tol=1e-12)
    assert torch.all(w > 0)


def test_exit_weight_shapes():
    L = 5
    u = exit_loss_weights(range(L), L, "uniform", 1.0)
    assert torch.allclose(u, torch.full((L,), 1 / L, dtype=u.dtype))
    lin = exit_loss_weights(range(L), L, "linear", 1.0)
    assert torch.allclose(lin, torch.arange(1, L + 1, dtype=lin.dtype) / 15)
    s = exit_loss_weights(range(L), L, "sum", 1.0)
    cum = torch.cumsum(torch.arange(1, L + 1, dtype=s.dtype), 0)  # 1, 3, 6, 10, 15
    assert torch.allclose(s, cum / cum.sum())
    # e_scale multiplies the early layers only
    s2 = exit_loss_weights(range(L), L, "sum", 0.5)
    e = cum.clone()
    e[:-1] *= 0.5
    assert torch.allclose(s2, e / e.sum())
    # e_scale = 0 leaves the final layer's loss alone
    assert exit_loss_weights([1, L - 1], L, "sum", 0.0).tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="uniform, linear, sum"):
        exit_loss_weights([0], L, "quadratic")


# ------------------------------------------------------------------------------------------------- curricula
def test_curriculum_none():
    assert curriculum_layers("none", 17, 6) == list(range(6))


def test_curriculum_rotational():
    L = 8
    assert curriculum_layers("rotational", 0, L, 3) == [0, 3, 6, 7]
    assert curriculum_layers("rotational", 1, L, 3) == [2, 5, 7]
    assert curriculum_layers("rotational", 2, L, 3) == [1, 4, 7]
    assert curriculum_layers("rotational", 3, L, 3) == [0, 3, 6, 7]
    # over R consecutive steps every layer gets its loss exactly once (last layer: every step)
    seen = [l for s in range(5, 5 + 4) for l in curriculum_layers("rotational", s, L, 4) if l != L - 1]
    assert sorted(seen) == list(range(L - 1))
    assert curriculum_layers("rotational", 5, L, 1) == list(range(L))


def test_curriculum_gradual():
    L = 4
    got = [curriculum_layers("gradual", s, L, 2) for s in range(9)]
    assert got[0] == got[1] == [3]
    assert got[2] == got[3] == [2, 3]
    assert got[4] == [1, 2, 3]
    assert got[6] == got[8] == [0, 1, 2, 3]


# --------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("kw, msg", [
    (dict(p_max=1.0), r"p_max must be in \[0, 1\)"),
    (dict(p_max=-0.1), r"p_max"),
    (dict(curriculum="cosine"), "none, rotational, gradual"),
    (dict(scale="log"), "uniform, linear, sum"),
    (dict(steps=0), "steps must be an integer >= 1"),
    (dict(batch_size=0), "batch_size"),
    (dict(seq_len=1), "seq_len"),
    (dict(lr=0), "lr"),
    (dict(e_scale=-1), "e_scale"),
    (dict(curriculum_param=0), "curriculum_param"),
    (dict(schedule="step"), "cosine, linear, constant"),
    (dict(warmup=-1), "warmup"),
    (dict(grad_clip=-1), "grad_clip"),
])
def test_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        TrainConfig(**kw)


def test_lr_schedule():
    cfg = TrainConfig(steps=20, warmup=4, lr=1e-3, min_lr_ratio=0.1)
    assert math.isclose(lr_at(0, cfg), 2.5e-4) and math.isclose(lr_at(3, cfg), 1e-3)
    assert math.isclose(lr_at(4, cfg), 1e-3) and math.isclose(lr_at(19, cfg), 1e-4)
    lrs = [lr_at(s, cfg) for s in range(4, 20)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


# ----------------------------------------------------------------------------------------------------- loss
def test_baseline_loss_is_hf_loss():
    model = tiny().eval()
    x = ids(T=16)
    loss, per_layer = early_exit_loss(model, x, [3], exit_loss_weights([3], 4))
    ref = model(x, labels=x).loss
    assert abs(loss.item() - ref.item()) < 1e-5 and abs(per_layer[3] - ref.item()) < 1e-5


def test_early_exit_loss_is_weighted_sum_and_head_checkpoint_matches():
    model = tiny().eval()
    x = ids(T=16)
    layers = [0, 2, 3]
    w = exit_loss_weights(layers, 4, "sum", 0.5)
    loss, per = early_exit_loss(model, x, layers, w)
    assert abs(loss.item() - sum(wi * per[l] for wi, l in zip(w.tolist(), layers))) < 1e-5
    loss.backward()
    g1 = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    loss2, _ = early_exit_loss(model, x, layers, w, checkpoint_head=True)
    loss2.backward()
    assert abs(loss.item() - loss2.item()) < 1e-6
    for n, p in model.named_parameters():
        assert torch.allclose(g1[n], p.grad, atol=1e-6), n


# ---------------------------------------------------------------------------------------------------- train
def test_train_lowers_loss_recipe_and_baseline(tmp_path):
    for recipe in (True, False):
        model = tiny()
        cfg = TrainConfig(steps=15, batch_size=4, seq_len=16, lr=5e-3, warmup=2, p_max=0.2, e_scale=1.0,
                          curriculum="rotational", curriculum_param=2, recipe=recipe)
        h = train(model, blocks_fn(4, 16), cfg, progress=False)
        assert len(h["loss"]) == 15 and not model.training
        assert sum(h["final_ce"][-5:]) < 0.7 * sum(h["final_ce"][:5])
        if recipe:
            assert h["n_exits"][:2] == [3, 2]  # rotational R=2 on 4 layers: {0,2,3}, {1,3}
        else:
            assert set(h["n_exits"]) == {1} and h["loss"] == h["final_ce"]


def test_bf16_autocast_on_the_cpu_is_an_option_that_changes_the_key_only_when_on():
    from earlyexit.training.checkpoints import Recipe

    base = dict(steps=4, batch_size=2, seq_len=16, lr=5e-3, warmup=1, p_max=0.2, curriculum_param=2)
    fp32, bf16 = TrainConfig(**base), TrainConfig(**base, amp_cpu=True)
    assert Recipe("tiny-llama", fp32).key() == Recipe("tiny-llama", TrainConfig(**base, amp_cpu=False)).key()
    assert Recipe("tiny-llama", bf16).key() != Recipe("tiny-llama", fp32).key()
    runs = {}
    for name, cfg in (("fp32", fp32), ("bf16", bf16), ("bf16 again", bf16)):
        model = tiny()
        runs[name] = (train(model, blocks_fn(2, 16), cfg, progress=False)["loss"], model.lm_head.weight.dtype)
    assert runs["bf16"] == runs["bf16 again"], "the same seed gives the same bf16 run"
    assert runs["bf16"][0] != runs["fp32"][0], "autocast on the CPU is used"
    assert runs["bf16"][1] == torch.float32, "weights stay float32 under autocast"
    assert max(abs(a - b) for a, b in zip(runs["bf16"][0], runs["fp32"][0])) < 0.1


@pytest.mark.parametrize("amp, amp_cpu, device_type, expected", [
    (True, False, "cuda", True), (False, False, "cuda", False), (True, True, "cpu", True),
    (True, False, "cpu", False), (False, True, "cuda", False), (True, True, "mps", False)])
def test_autocast_follows_the_device_switch(amp, amp_cpu, device_type, expected):
    assert TrainConfig(amp=amp, amp_cpu=amp_cpu).autocast(device_type) is expected


def test_resume_reproduces_uninterrupted_run(tmp_path):
    cfg = TrainConfig(steps=6, batch_size=3, seq_len=12, lr=2e-3, warmup=2, p_max=0.5, e_scale=0.5,
                      curriculum="rotational", curriculum_param=2, weight_decay=0.01, checkpoint_every=1,
                      keep_checkpoints=2, seed=5)
    blocks = blocks_fn(3, 12)

    straight = tiny(seed=0)
    h_straight = train(straight, blocks, cfg, tmp_path / "a", progress=False)

    class Crash(Exception):
        pass

    def crashing(step):
        if step == 3:
            raise Crash
        return blocks(step)

    first = tiny(seed=0)
    with pytest.raises(Crash):
        train(first, crashing, cfg, tmp_path / "b", progress=False)
    ck = latest_checkpoint(tmp_path / "b")
    assert ck.name == "step_00000003"
    state = torch.load(ck / "train_state.pt", weights_only=True)
    assert state["step"] == 3
    resumed = tiny(seed=123)  # different init: the checkpoint's weights must replace it
    h_resumed = train(resumed, blocks, cfg, tmp_path / "b", progress=False)

    for (n, p), (_, q) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert (p - q).abs().max().item() <= 1e-6, n
    assert h_resumed["loss"] == pytest.approx(h_straight["loss"], abs=1e-6)
    # checkpoints: newest two kept, no temporary directories left behind
    names = sorted(p.name for p in (tmp_path / "b").iterdir())
    assert names == ["step_00000005", "step_00000006"]
    meta = json.loads((tmp_path / "b" / "step_00000006" / "train_meta.json").read_text())
    assert meta["step"] == 6 and len(meta["history"]["loss"]) == 6


def test_checkpoint_loads_with_from_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny()
    cfg = TrainConfig(steps=2, batch_size=2, seq_len=8, lr=1e-3, warmup=0)
    train(model, blocks_fn(2, 8), cfg, tmp_path, progress=False)
    back = AutoModelForCausalLM.from_pretrained(latest_checkpoint(tmp_path))
    for (n, p), (_, q) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(p, q), n


def test_resume_refuses_other_config(tmp_path):
    cfg = TrainConfig(steps=2, batch_size=2, seq_len=8, warmup=0)
    train(tiny(), blocks_fn(2, 8), cfg, tmp_path, progress=False)
    with pytest.raises(ValueError, match="p_max"):
        train(tiny(), blocks_fn(2, 8), TrainConfig(steps=2, batch_size=2, seq_len=8, warmup=0, p_max=0.3),
              tmp_path, progress=False)


def test_train_checks_block_shape():
    cfg = TrainConfig(steps=1, batch_size=2, seq_len=8)
    with pytest.raises(ValueError, match=r"\(2, 8\)"):
        train(tiny(), lambda s: torch.zeros(2, 9, dtype=torch.long), cfg, progress=False)


# ------------------------------------------------------------------------------------------------ agreement
def test_per_layer_agreement():
    model = tiny()
    held = ids(batch=4, T=16, seed=9)
    df = per_layer_agreement(model, held)
    assert list(df.columns) == ["layer", "agreement", "loss", "ppl"]
    assert df["layer"].tolist() == [0, 1, 2, 3]
    assert df["agreement"].iloc[-1] == 1.0 and ((df["agreement"] >= 0) & (df["agreement"] <= 1)).all()
    assert abs(df["loss"].iloc[-1] - model(held, labels=held).loss.item()) < 1e-4
    assert torch.allclose(torch.tensor(df["ppl"].values), torch.exp(torch.tensor(df["loss"].values)))
    # iterable of batches gives the same numbers
    df2 = per_layer_agreement(model, [held[:2], held[2:]])
    assert torch.allclose(torch.tensor(df2["loss"].values), torch.tensor(df["loss"].values), atol=1e-6)
    # agreement at layer l by hand
    with torch.no_grad():
        hs = forward_layers(model, held)
        fin = exit_logits(model, hs[3][:, :-1]).argmax(-1)
        a1 = (exit_logits(model, hs[1][:, :-1]).argmax(-1) == fin).double().mean().item()
    assert abs(df["agreement"].iloc[1] - a1) < 1e-12

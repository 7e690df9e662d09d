"""Packed weights (CPU inference): the same decoding as the modules' own layout up to float rounding, never
stale after the weights change, never used with gradients on."""
import pytest
import torch

from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.adapter import PACK_MAX_ROWS, Adapter, Packed
from earlyexit.engine.models import load_model

IDS = [list(range(40, 61)), list(range(7, 19))]


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-qwen2"])   # qwen2: q/k/v biases go through the pack
@pytest.mark.parametrize("method", ["full", "copy-forward", "lazy-recompute", "selfspec-short"])
def test_packed_decoding_equals_the_module_layout(spec, method):
    torch.set_num_threads(1)
    lm = load_model(spec)
    L = lm.num_layers
    if method == "full":
        cfg = DecodeConfig.full()
    elif method == "selfspec-short":
        cfg = DecodeConfig.self_speculation(L // 2, 2, shortlist=64)
    else:
        cfg = DecodeConfig.early_exit("softmax", method, threshold=0.2, min_layer=1)
    prompts = IDS if cfg.method == "early-exit" else IDS[0]
    kw = {"return_logits": True, "stop_at_eos": False} if cfg.method == "early-exit" else {"stop_at_eos": False}
    packed = decode(lm, prompts, cfg, 12, **kw)
    if method == "selfspec-short":   # lossless: the full model's greedy tokens, in the module layout
        plain = decode(Adapter(lm, pack=False), prompts, DecodeConfig.full(), 12, stop_at_eos=False)
    else:
        plain = decode(Adapter(lm, pack=False), prompts, cfg, 12, **kw)
    assert Adapter(lm).for_inference().packed is not None
    assert packed.tokens.tolist() == plain.tokens.tolist()
    if packed.logits is not None:
        assert torch.allclose(packed.logits, plain.logits, atol=1e-4)
        assert packed.counts["layers_run"].tolist() == plain.counts["layers_run"].tolist()


def test_packed_weights_follow_the_model_and_stay_out_of_training():
    torch.set_num_threads(1)
    lm = load_model("tiny-llama")
    A = Adapter(lm).for_inference()
    first = A.packed
    assert Packed.of(Adapter(lm)) is first                  # one copy per model and weight version
    with torch.no_grad():
        lm.model.model.layers[0].mlp.up_proj.weight.mul_(1.5)   # a training step would do this in place
    A2 = Adapter(lm).for_inference()
    assert A2.packed is not first
    up = lm.model.model.layers[0].mlp.up_proj.weight
    I = up.shape[0]
    assert torch.equal(A2.packed.guT[0][:, I:], up.t())
    ids = IDS[0]
    a = decode(A2, [ids], DecodeConfig.full(), 6, stop_at_eos=False, return_logits=True)
    b = decode(Adapter(lm, pack=False), [ids], DecodeConfig.full(), 6, stop_at_eos=False, return_logits=True)
    assert torch.allclose(a.logits, b.logits, atol=1e-4)
    # with gradients on (training), the adapter uses the modules, so gradients reach the weights
    with torch.enable_grad():
        assert A2._pack(1) is None
        out = A2.logits(A2.embed(torch.tensor([[3]])))
        out.sum().backward()
    assert lm.model.lm_head.weight.grad is not None
    with torch.no_grad():
        assert A2._pack(PACK_MAX_ROWS) is not None and A2._pack(PACK_MAX_ROWS + 1) is None


def test_fused_rms_norm_is_bit_identical_to_the_module():
    lm = load_model("tiny-llama")
    A = Adapter(lm).for_inference()
    norm = A.layers[0].input_layernorm
    with torch.no_grad():
        norm.weight.copy_(torch.randn_like(norm.weight))
        h = torch.randn(2, 5, norm.weight.shape[0]) * 3
        assert torch.equal(A.rms(norm, h), norm(h))


def test_cpu_float32_packs_by_default_and_bfloat16_does_not():
    assert Adapter(load_model("tiny-llama")).pack is True
    assert Adapter(load_model("tiny-llama", dtype="bfloat16")).pack is False

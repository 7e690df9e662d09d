"""Packed weights (CPU inference): the same decoding as the modules' own layout up to float rounding, never
stale after the weights change, never used with gradients on."""
import pytest
import torch

from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.adapter import Adapter, Packed, onednn_available
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
    x, g = torch.randn(3, up.shape[1]), torch.randn(3, up.shape[0])
    with torch.no_grad():                                   # W_up times its post-op factor, from the new weights
        assert torch.allclose(torch.ops.mkldnn._linear_pointwise.binary(x, g, A2.packed.up[0], None, "mul"),
                              (x @ up.t()) * g, atol=1e-5)
    ids = IDS[0]
    a = decode(A2, [ids], DecodeConfig.full(), 6, stop_at_eos=False, return_logits=True)
    b = decode(Adapter(lm, pack=False), [ids], DecodeConfig.full(), 6, stop_at_eos=False, return_logits=True)
    assert torch.allclose(a.logits, b.logits, atol=1e-4)
    # with gradients on (training), the adapter uses the modules, so gradients reach the weights
    with torch.enable_grad():
        assert A2._pack() is None
        out = A2.logits(A2.embed(torch.tensor([[3]])))
        out.sum().backward()
    assert lm.model.lm_head.weight.grad is not None
    with torch.no_grad():
        assert A2._pack() is not None       # every product, whatever its rows: one token, a chunk, a prompt


def test_fused_rms_norm_is_bit_identical_to_the_module():
    lm = load_model("tiny-llama")
    A = Adapter(lm).for_inference()
    norm = A.layers[0].input_layernorm
    with torch.no_grad():
        norm.weight.copy_(torch.randn_like(norm.weight))
        h = torch.randn(2, 5, norm.weight.shape[0]) * 3
        assert torch.equal(A.rms(norm, h), norm(h))


def test_cpu_packs_float32_and_bfloat16_by_default():
    """float32 packs on every x86 CPU; bfloat16 where oneDNN can pack it (AVX-512 BW/VL/DQ or AVX-NE-CONVERT),
    and elsewhere (an AVX2-only CPU, such as a Zen 3 EPYC) the default is the modules' own layout."""
    assert Adapter(load_model("tiny-llama")).pack is True
    assert Adapter(load_model("tiny-llama", dtype="bfloat16")).pack is onednn_available(torch.bfloat16)


def test_packing_a_model_that_cannot_be_packed_is_refused():
    lm = load_model("tiny-llama")
    lm.model.to("meta")
    with pytest.raises(ValueError, match="CPU torch build with oneDNN"):
        Adapter(lm, pack=True)


def test_bfloat16_packed_decoding_is_as_close_to_float32_as_the_module_layout():
    """bfloat16 rounds differently in oneDNN's kernels and in torch's: neither matches float32 to the bit, and
    the packed kernels must not be the worse of the two."""
    torch.set_num_threads(1)
    lm = load_model("tiny-llama", dtype="bfloat16")
    ref = load_model("tiny-llama")
    ids = IDS[0]
    a = decode(lm, [ids], DecodeConfig.full(), 8, stop_at_eos=False, return_logits=True)
    kw = dict(stop_at_eos=False, return_logits=True, force=a.tokens)
    b = decode(Adapter(lm, pack=False), [ids], DecodeConfig.full(), 8, **kw)
    f = decode(Adapter(ref, pack=False), [ids], DecodeConfig.full(), 8, **kw)
    packed_err, module_err = (a.logits - f.logits).abs().mean(), (b.logits - f.logits).abs().mean()
    assert packed_err <= 1.5 * module_err, (packed_err, module_err)


def test_the_packed_products_equal_the_modules_at_every_row_count():
    """One row, a verification chunk, a recompute batch and a prompt: the same products to float rounding."""
    lm = load_model("tiny-llama")
    A = Adapter(lm).for_inference()
    D = lm.model.config.hidden_size
    with torch.no_grad():
        for rows in (1, 2, 3, 5, 17, 96):
            h = torch.randn(1, rows, D)
            assert torch.allclose(A.logits(h), lm.model.lm_head(A.norm(h)), atol=1e-4)
            o = torch.randn(1, A.H, rows, A.d)
            mine = A.finish_layer(0, h, o)
            layer = A.layers[0]
            h2 = h + layer.self_attn.o_proj(o.transpose(1, 2).reshape(1, rows, A.H * A.d))
            ref = h2 + layer.mlp(layer.post_attention_layernorm(h2))
            assert torch.allclose(mine, ref, atol=1e-4)

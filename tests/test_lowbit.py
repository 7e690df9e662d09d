"""The weight-only low-precision paths (engine.lowbit): int4 holds Q4_1 blocks exactly, every family runs on both
paths close to float32, self-speculation on them gives the path's own full-depth tokens (up to exact ties of the
bf16 products' logits), and a path that cannot run says so before any work, naming what runs instead."""
import pytest
import torch

from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.adapter import Adapter
from earlyexit.engine.lowbit import (GROUP, WEIGHTS, LowBitAdapter, _Int4, _Int8, dequantize_int4, int4_blocks,
                                     int8_rows)
from earlyexit.engine.models import load_model

FAMILIES = ["tiny-llama", "tiny-llama-hd", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"]
IDS = [list(range(40, 57)), list(range(7, 16))]


def q41_weight(n, k, seed=0):
    """A weight made of Q4_1 blocks as a GGUF stores them: 4-bit q, half-precision scale and minimum."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k // GROUP, GROUP), generator=g)
    q[..., 0], q[..., 1] = 0, 15                     # a quantizer puts the block's minimum and maximum at 0 and 15
    d = (torch.rand(n, k // GROUP, generator=g) * 0.02 + 1e-3).half().float()
    m = (-torch.rand(n, k // GROUP, generator=g) * 0.1).half().float()
    return (q.float() * d[..., None] + m[..., None]).view(n, k)


def test_int4_recovers_q41_blocks_exactly():
    W = q41_weight(64, 128)
    q, d, m = int4_blocks(W)
    assert int(q.min()) >= 0 and int(q.max()) <= 15
    assert torch.equal(dequantize_int4(q, d, m), W)


def test_the_products_match_their_weights_at_bf16_precision_and_do_not_depend_on_the_row_count():
    W = q41_weight(96, 64, seed=1)
    x = torch.randn(1, 5, 64)
    ref = x.bfloat16().float() @ W.T
    for f in (_Int4(W, None), _Int8(W, None)):
        y = f(x)
        assert y.dtype == torch.float32 and y.shape == (1, 5, 96)
        assert (y - ref).abs().max() <= 0.02 * ref.abs().max()
        one = torch.cat([f(x[:, i:i + 1]) for i in range(5)], 1)
        assert torch.equal(y, one)       # a verification chunk computes what one row at a time would
    q, s = int8_rows(W)
    assert q.dtype == torch.int8 and (q.float() * s[:, None] - W).abs().max() <= s.max() / 2 + 1e-7


def as_gguf_would_store(lm):
    """The model's decoder matrices rounded to Q4_1 blocks (half-precision scale and minimum), as the embedded
    GGUF stores SmolLM2's: what the int4 path is for."""
    with torch.no_grad():
        for layer in lm.model.model.layers:
            for m in (*[getattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")],
                      layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
                q, d, mn = int4_blocks(m.weight)
                m.weight.copy_(dequantize_int4(q, d.half().float(), mn.half().float()))
    return lm


@pytest.mark.parametrize("kind", WEIGHTS)
@pytest.mark.parametrize("spec", FAMILIES)
def test_every_family_runs_on_every_low_precision_path(spec, kind):
    """Full depth on the path against float32 on the same weights (Q4_1 blocks for int4): only the products'
    bf16 inputs, outputs and scales (and int8's rounding) differ; then self-speculation on the path."""
    torch.set_num_threads(1)
    lm = load_model(spec)
    if kind == "int4":
        as_gguf_would_store(lm)
    ref = decode(Adapter(lm), IDS, DecodeConfig.full(), 8, stop_at_eos=False, return_logits=True)
    A = LowBitAdapter(lm, kind)
    r = decode(A, IDS, DecodeConfig.full(), 8, stop_at_eos=False, return_logits=True, force=ref.tokens)
    scale = float(ref.logits.abs().max())
    # int4 on Q4_1 weights: bf16 rounding alone (seen up to 3.4% of the logit scale on these random models);
    # int8 also rounds each weight to 1/254 of its row's largest (seen up to 5.8%)
    tol = {"int4": 0.05, "int8": 0.1}[kind]
    assert float((r.logits - ref.logits).abs().max()) <= tol * scale, (spec, kind)
    own = decode(A, IDS[:1], DecodeConfig.full(), 10, stop_at_eos=False, return_logits=True)
    for E, d in ((2, 2), (1, 3)):
        sp = decode(A, IDS[:1], DecodeConfig.self_speculation(E, d), 10, stop_at_eos=False)
        a, b = own.tokens[0].tolist(), sp.tokens[0].tolist()
        first = next((i for i in range(len(a)) if a[i] != b[i]), None)
        if first is not None:
            # lossless up to ties: the bf16 products' logits are coarse enough for two tokens to tie exactly,
            # and the verification chunk's float32 attention may round the other way there
            top2 = own.logits[0, first].topk(2).values
            assert float(top2[0] - top2[1]) <= 2 ** -7 * float(top2[0].abs()), (spec, kind, E, d, first)


def test_a_path_that_cannot_run_says_so_and_names_what_runs_instead():
    lm = load_model("tiny-llama")
    with pytest.raises(ValueError, match="choose one of int8, int4"):
        LowBitAdapter(lm, "int2")
    with pytest.raises(ValueError, match="plain Adapter runs the model's own torch.bfloat16"):
        LowBitAdapter(load_model("tiny-llama", dtype="bfloat16"), "int4")
    odd = load_model("tiny-llama")
    odd.model.config.intermediate_size = 100          # as a model whose MLP width is no multiple of 32 would say
    with pytest.raises(ValueError, match="int8 path"):
        LowBitAdapter(odd, "int4")


@pytest.mark.embedded
def test_the_int4_path_holds_the_embedded_gguf_q41_weights_exactly():
    """transformers dequantized the GGUF's Q4_1 blocks to float32; int4_blocks finds every block's q, d and m
    again, so the int4 path reads the file's own weights (the head is Q8_0 in the file and int8 here)."""
    lm = load_model("smollm2-135m")
    for layer in lm.model.model.layers[::7]:
        for m in (layer.self_attn.q_proj, layer.self_attn.v_proj, layer.mlp.down_proj):
            W = m.weight.detach()
            assert torch.equal(dequantize_int4(*int4_blocks(W)), W)

"""Every family the adapter accepts, on every weight path: full depth equals Hugging Face's greedy decoding token for
token (logits within float rounding of the path's precision), and self-speculation stays lossless. Families: Llama,
Llama with head_dim != hidden / heads, Qwen2 (q/k/v biases), Qwen3 (q/k norms, its own head_dim), Mistral."""
import pytest
import torch

from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.adapter import Adapter, onednn_available
from earlyexit.engine.models import load_model

FAMILIES = ["tiny-llama", "tiny-llama-hd", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"]
# (weights dtype, packed for oneDNN); logits tolerance against HF at that precision
PATHS = {"module fp32": ("float32", False, 1e-4), "packed fp32": ("float32", True, 1e-4),
         "packed bf16": ("bfloat16", True, None)}
IDS = [list(range(40, 57)), list(range(7, 16))]


def hf_greedy(model, ids, n):
    out = []
    for p in ids:
        x = torch.tensor([p])
        with torch.inference_mode():
            g = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                               eos_token_id=None, pad_token_id=model.config.pad_token_id,
                               output_scores=True, return_dict_in_generate=True)
        out.append((g.sequences[0, len(p):].tolist(), torch.stack(g.scores)[:, 0].float()))
    return out


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("spec", FAMILIES)
def test_full_depth_equals_hf_greedy_on_every_weight_path(spec, path):
    torch.set_num_threads(1)
    dtype, pack, atol = PATHS[path]
    lm = load_model(spec, dtype=dtype)
    if pack and not onednn_available(getattr(torch, dtype)):
        # a CPU whose oneDNN cannot pack this dtype (bf16 without AVX-512): asking for packing says why, and the
        # default falls back to the modules' own layout, which must still match HF
        with pytest.raises(ValueError, match="cannot pack"):
            Adapter(lm, pack=True)
        pack = None
    A = Adapter(lm, pack=pack)
    assert pack is not None or A.pack == onednn_available(getattr(torch, dtype))
    ref = hf_greedy(lm.model, IDS, 10)
    if atol is not None:
        r = decode(A, IDS, DecodeConfig.full(), 10, stop_at_eos=False, return_logits=True)
        for b, (toks, scores) in enumerate(ref):
            assert r.tokens[b].tolist() == toks, (spec, path, b)
            assert torch.allclose(r.logits[b], scores, atol=atol), (spec, path, b)
    else:
        # bf16: both round at every product, in different orders, so a near tie can fall either way and one
        # flipped token changes everything after it. Teacher-forced on HF's tokens, the logits stay within bf16
        # rounding (a few percent of their scale), and wherever HF's top-1 leads by more than twice that, the
        # engine picks the same token.
        force = torch.tensor([t for t, _ in ref])
        r = decode(A, IDS, DecodeConfig.full(), 10, stop_at_eos=False, return_logits=True, force=force)
        for b, (toks, scores) in enumerate(ref):
            tol = 0.04 * float(scores.abs().max())
            assert float((r.logits[b] - scores).abs().max()) <= tol, (spec, b)
            top2 = scores.topk(2, -1).values
            clear = (top2[:, 0] - top2[:, 1]) > 2 * tol
            assert (r.logits[b].argmax(-1) == scores.argmax(-1))[clear].all(), (spec, b)
    sp = decode(A, IDS[:1], DecodeConfig.self_speculation(2, 2), 10, stop_at_eos=False)
    own = decode(A, IDS[:1], DecodeConfig.full(), 10, stop_at_eos=False)
    assert sp.tokens.tolist() == own.tokens.tolist(), "self-speculation is lossless on this path"


def test_the_packed_weights_do_not_shadow_the_method_that_uses_them():
    """Qwen3 (q/k norms) goes through Packed.qkv: a list attribute of that name made it `list object is not
    callable` (found by a new user); the fused weights are w_qkv now."""
    lm = load_model("tiny-qwen3")
    A = Adapter(lm).for_inference()
    assert callable(A.packed.qkv) and isinstance(A.packed.w_qkv, list)
    decode(A, IDS[:1], DecodeConfig.early_exit("softmax", "copy-forward", threshold=0.2, min_layer=1), 6)

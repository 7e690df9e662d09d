"""The engine's invariants on the real embedded model (SmolLM2-135M-Instruct, fp32 on CPU)."""
import pytest
import torch

from earlyexit.engine.cache import HOLE
from earlyexit.corpus import encode, load_prompts
from helpers import gen as generate
from helpers import spec as self_speculative
from earlyexit.engine.models import GGUF_NAME, embedded_dir, load_model

pytestmark = [pytest.mark.embedded,
              pytest.mark.skipif(not (embedded_dir() / GGUF_NAME).exists(),
                                 reason="embedded model not fetched: run `python -m earlyexit fetch-model`")]


@pytest.fixture(scope="module")
def lm():
    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="module")
def prompts(lm):
    ps = load_prompts("mix", 21, seed=0, tokenizer=lm.tokenizer, max_prompt_tokens=96)
    return encode(ps, lm.tokenizer, 96)


def hf_greedy(model, ids, n):
    x = torch.tensor([ids])
    # attention_mask matters: pad id == eos id == <|im_end|>, which chat prompts contain
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=2)
    return out[0, len(ids):].tolist()


def test_full_depth_equals_hf_generate_on_20_prompts(lm, prompts):
    assert len(prompts) >= 20
    for ids in prompts:
        tr = generate(lm, [ids], 64, stop_at_eos=False)
        assert tr.tokens[0].tolist() == hf_greedy(lm.model, ids, 64)


def test_logits_match_hf_forward(lm, prompts):
    for ids in prompts[:3]:
        tr = generate(lm, [ids], 32, stop_at_eos=False, return_logits=True)
        with torch.no_grad():
            ref = lm.model(torch.tensor([ids + tr.tokens[0, :-1].tolist()])).logits[0, len(ids) - 1:]
        # fp32 on both sides, summed in different orders (the kernels differ by CPU: AVX2 or AVX-512): equal to
        # a few ulps of the logits' scale (about 30), i.e. within 1e-5 relative
        assert torch.allclose(tr.logits[0], ref, rtol=1e-5, atol=1e-4), (tr.logits[0] - ref).abs().max()


def test_recompute_leaves_the_teacher_forced_cache(lm, prompts):
    kw = dict(threshold=0.5, min_layer=15)
    for ids in prompts[:2]:
        toks = {}
        for strat in ("lazy-recompute", "eager-recompute"):
            tr = generate(lm, [ids], 24, rule="softmax", rule_kw=kw, strategy=strat, stop_at_eos=False,
                          flush=True, return_kv=True)
            assert (tr.exit_layer[0] < 30).any()
            seq = ids + tr.tokens[0, :-1].tolist()
            with torch.no_grad():
                pkv = lm.model(torch.tensor([seq]), use_cache=True).past_key_values
            for l, layer in enumerate(pkv.layers):
                assert torch.allclose(tr.kv[0][l, 0, :, :len(seq)], layer.keys[0], atol=1e-4)
                assert torch.allclose(tr.kv[1][l, 0, :, :len(seq)], layer.values[0], atol=1e-4)
            assert not (tr.flushed_state[:, 0, :len(seq)] == HOLE).any()
            toks[strat] = tr.tokens[0].tolist()
        assert toks["lazy-recompute"] == toks["eager-recompute"]


def test_oracle_with_lazy_recompute_is_the_full_model(lm, prompts):
    for ids in prompts[:3]:
        full = generate(lm, [ids], 32, stop_at_eos=False).tokens[0].tolist()
        tr = generate(lm, [ids], 32, rule="oracle", strategy="lazy-recompute", stop_at_eos=False)
        assert tr.tokens[0].tolist() == full
        assert tr.mean_layers() <= 30


@pytest.mark.parametrize("E, d", [(8, 3), (16, 4), (24, 6)])
def test_self_speculative_is_lossless(lm, prompts, E, d):
    for ids in prompts[:2]:
        full = generate(lm, [ids], 24, stop_at_eos=False).tokens[0].tolist()
        assert self_speculative(lm, ids, 24, E, d, stop_at_eos=False).sequences()[0] == full

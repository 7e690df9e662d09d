"""Invariants of the decoding engine and its cache, on tiny seeded models of each supported family."""
import pytest
import torch

from earlyexit.engine.cache import COMPUTED, COPIED, HOLE, RECOMPUTED
from helpers import gen as generate
from earlyexit.engine.rules import make_rule
from earlyexit.engine.models import tiny_model

FAMILIES = ["tiny-llama", "tiny-llama3", "tiny-qwen2", "tiny-mistral"]
STRATS = ["naive-mask", "naive-undefined", "copy-forward", "lazy-recompute", "eager-recompute"]


@pytest.fixture(scope="module")
def models():
    return {f: tiny_model(f) for f in FAMILIES}


def prompt(seed, n=10):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 5000, (n,), generator=g).tolist()


def hf_greedy(model, ids, n):
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def teacher_forced_cache(model, ids):
    """K/V of every layer from one HF forward over the whole sequence (the model's own cache)."""
    with torch.no_grad():
        pkv = model(torch.tensor([ids]), use_cache=True).past_key_values
    return [(layer.keys[0], layer.values[0]) for layer in pkv.layers]


@pytest.mark.parametrize("family", FAMILIES)
def test_full_depth_equals_hf_generate(models, family):
    m = models[family]
    for seed in range(3):
        ids = prompt(seed)
        tr = generate(m, [ids], 24, stop_at_eos=False, return_logits=True)
        assert tr.tokens[0].tolist() == hf_greedy(m, ids, 24)
        full = torch.tensor([ids + tr.tokens[0, :-1].tolist()])
        with torch.no_grad():
            ref = m(full).logits[0, len(ids) - 1:]
        assert torch.allclose(tr.logits[0], ref, atol=1e-4), (tr.logits[0] - ref).abs().max()


RULES = {"scripted": dict(exits=(6, 2, 4, 6, 1, 6, 3, 3, 5, 2, 6, 1)),
         "saturation": dict(threshold=0.5, min_layer=2)}


@pytest.mark.parametrize("rule", list(RULES))
def test_recompute_is_exact(models, rule):
    m = models["tiny-llama"]
    ids = prompt(7)
    n = 14
    runs = {}
    for strat in ["lazy-recompute", "eager-recompute"]:
        tr = generate(m, [ids], n, rule=rule, rule_kw=RULES[rule], strategy=strat, stop_at_eos=False,
                      flush=True, return_kv=True)
        runs[strat] = tr
        assert (tr.exit_layer[0] < m.config.num_hidden_layers).any(), "the test needs some exits"
        seq = ids + tr.tokens[0, :-1].tolist()
        ref = teacher_forced_cache(m, seq)
        T = len(seq)
        for l, (k, v) in enumerate(ref):
            assert torch.allclose(tr.kv[0][l, 0, :, :T], k, atol=1e-4), (strat, l)
            assert torch.allclose(tr.kv[1][l, 0, :, :T], v, atol=1e-4), (strat, l)
        assert not (tr.flushed_state[:, 0, :T] == HOLE).any()
    assert runs["lazy-recompute"].tokens.tolist() == runs["eager-recompute"].tokens.tolist()


def test_lazy_recompute_with_oracle_equals_full_depth(models):
    m = models["tiny-qwen2"]
    for seed in range(3):
        ids = prompt(seed)
        full = generate(m, [ids], 16, stop_at_eos=False)
        lazy = generate(m, [ids], 16, rule="oracle", strategy="lazy-recompute", stop_at_eos=False)
        assert lazy.tokens.tolist() == full.tokens.tolist()


def test_copy_forward_exiting_at_last_layer_is_full_depth(models):
    m = models["tiny-llama"]
    L = m.config.num_hidden_layers
    ids = prompt(3)
    full = generate(m, [ids], 16, stop_at_eos=False)
    cf = generate(m, [ids], 16, rule="scripted", rule_kw=dict(exits=(L,) * 16), strategy="copy-forward",
                  stop_at_eos=False)
    assert cf.tokens.tolist() == full.tokens.tolist()
    assert cf.counts["copied_kv"].sum() == 0


@pytest.mark.parametrize("strat", ["naive-mask", "naive-undefined"])
def test_naive_holes_exactly_above_exit(models, strat):
    m = models["tiny-llama"]
    L = m.config.num_hidden_layers
    ids = prompt(11)
    tr = generate(m, [ids], 12, rule="scripted", rule_kw=RULES["scripted"], strategy=strat,
                  stop_at_eos=False, audit_weights=True)
    P = tr.prompt_len
    assert (tr.state[:, 0, :P] == COMPUTED).all()
    for t in range(1, 12):
        col, e = P + t - 1, int(tr.exit_layer[0, t])
        assert e == RULES["scripted"]["exits"][t]
        for l in range(L):  # l is 0-based: layer l+1 is a hole iff l+1 > e
            assert (tr.state[l, 0, col] == HOLE) == (l + 1 > e), (t, l, e)
    hw = tr.counts["hole_weight"]
    assert (tr.counts["hole_reads"] > 0).any()
    if strat == "naive-mask":
        assert hw.abs().max() == 0
    else:
        assert hw.max() > 0.01


def test_naive_forms_differ_and_copy_forward_writes_copies(models):
    m = models["tiny-llama"]
    ids = prompt(5)
    out = {s: generate(m, [ids], 12, rule="scripted", rule_kw=RULES["scripted"], strategy=s,
                       stop_at_eos=False, return_logits=True) for s in STRATS}
    assert not torch.allclose(out["naive-mask"].logits, out["naive-undefined"].logits)
    st = out["copy-forward"].state
    assert (st == COPIED).any() and not (st[:, :, : out["copy-forward"].prompt_len + 10] == HOLE).any()
    assert (out["eager-recompute"].state == RECOMPUTED).any()


def test_skipdecode_never_reads_a_hole(models):
    m = models["tiny-llama"]
    L = m.config.num_hidden_layers
    kw = dict(e_max=L, e_min=3, horizon=6, warmup=1)
    rule = make_rule("skipdecode", L, **kw)
    for t in range(1, 20):  # each token's layers are contained in every earlier token's
        assert set(rule.plan(t)) <= set(rule.plan(t - 1))
    ids = prompt(2)
    for strat in ["naive-mask", "naive-undefined"]:
        tr = generate(m, [ids], 16, rule="skipdecode", rule_kw=kw, strategy=strat, stop_at_eos=False)
        assert (tr.state == HOLE)[:, 0, tr.prompt_len:tr.prompt_len + 15].any(), "unwritten entries exist"
        assert tr.counts["hole_reads"].sum() == 0
    a = generate(m, [ids], 16, rule="skipdecode", rule_kw=kw, strategy="naive-mask", stop_at_eos=False, return_logits=True)
    b = generate(m, [ids], 16, rule="skipdecode", rule_kw=kw, strategy="naive-undefined", stop_at_eos=False,
                 return_logits=True)
    assert torch.equal(a.logits, b.logits)  # nothing read a hole, so the two forms cannot differ


@pytest.mark.parametrize("strat", STRATS)
def test_batched_equals_per_sequence(models, strat):
    m = models["tiny-mistral"]
    prompts = [prompt(1, 6), prompt(2, 11), prompt(3, 9)]
    rk = dict(threshold=0.6, min_layer=2)
    batch = generate(m, prompts, 10, rule="saturation", rule_kw=rk, strategy=strat, stop_at_eos=False,
                     return_logits=True)
    for b, p in enumerate(prompts):
        one = generate(m, [p], 10, rule="saturation", rule_kw=rk, strategy=strat, stop_at_eos=False,
                       return_logits=True)
        assert batch.tokens[b].tolist() == one.tokens[0].tolist()
        assert batch.exit_layer[b].tolist() == one.exit_layer[0].tolist()
        assert torch.allclose(batch.logits[b], one.logits[0], atol=1e-4)
        for c in ("layers_run", "recompute_layers", "copied_kv"):
            assert torch.equal(batch.counts[c][b], one.counts[c][0]), c


def test_counts_match_hand_count(models):
    """L = 6; exits of tokens 1..5: 2, 4, 6, 1, 6 (token 0 comes from the prompt at full depth)."""
    m = models["tiny-llama"]
    ids = prompt(9)
    kw = dict(exits=(6, 2, 4, 6, 1, 6))
    got = {}
    for s in STRATS:
        tr = generate(m, [ids], 6, rule="scripted", rule_kw=kw, strategy=s, stop_at_eos=False)
        got[s] = tr
        assert tr.counts["layers_run"][0].tolist() == [6, 2, 4, 6, 1, 6]
    # lazy: t=2 runs token1 (level 2) through layers 3,4 with it; t=3 runs tokens 1,2 through 5,6;
    # t=5 runs token 4 (level 1) through layers 2..6.
    assert got["lazy-recompute"].counts["recompute_layers"][0].tolist() == [0, 0, 2, 4, 0, 5]
    assert got["eager-recompute"].counts["recompute_layers"][0].tolist() == [0, 4, 2, 0, 5, 0]
    assert got["copy-forward"].counts["copied_kv"][0].tolist() == [0, 4, 2, 0, 5, 0]
    for s in ("naive-mask", "naive-undefined"):
        assert got[s].counts["recompute_layers"].sum() == 0 and got[s].counts["copied_kv"].sum() == 0


def test_eos_stops_a_row(models):
    m = models["tiny-llama"]
    ids = prompt(4)
    free = generate(m, [ids], 8, stop_at_eos=False)
    m.config.eos_token_id = int(free.tokens[0, 3])
    try:
        tr = generate(m, [ids], 8)
    finally:
        m.config.eos_token_id = 2
    assert int(tr.n_new[0]) == 4 and tr.sequences()[0] == free.tokens[0, :4].tolist()


@pytest.mark.parametrize("kwargs, match", [
    (dict(rule="static", rule_kw=dict(layer=0)), r"\[1, 6\]"),
    (dict(rule="static", rule_kw=dict(layer=7)), r"\[1, 6\]"),
    (dict(rule="softmax", rule_kw=dict(threshold=0.0)), r"\(0, 1\]"),
    (dict(rule="margin", rule_kw=dict(threshold=1.5)), r"\(0, 1\]"),
    (dict(rule="bogus"), "valid: full, static"),
    (dict(strategy="nope"), "valid: naive-mask"),
    (dict(rule="skipdecode", rule_kw=dict(e_max=9, e_min=2)), "e_max"),
    (dict(rule="softmax", rule_kw=dict(treshold=0.5)), "takes"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=2045), "context of 2048"),
])
def test_bad_input_is_a_clear_error_before_compute(models, kwargs, match, monkeypatch):
    import earlyexit.engine.loop as dec
    m = models["tiny-llama"]

    def boom(*a, **k):
        raise AssertionError("compute started before validation")
    monkeypatch.setattr(dec, "Engine", boom)
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate(m, [prompt(0)], **kwargs)


def test_cache_memory_is_reported(models):
    m = models["tiny-llama"]
    tr = generate(m, [prompt(0)], 4, stop_at_eos=False)
    c = m.config
    d = c.hidden_size // c.num_attention_heads
    assert tr.cache_bytes == 2 * c.num_hidden_layers * c.num_key_value_heads * d * (10 + 4) * 4

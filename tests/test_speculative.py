"""Self-speculative decoding is lossless: its greedy output is the full model's, for any (E, d)."""
import math

import pytest
import torch

from helpers import gen as generate
from helpers import spec as self_speculative
from earlyexit.engine.models import tiny_model
from earlyexit.engine import DecodeConfig, decode


@pytest.fixture(scope="module")
def model():
    return tiny_model("tiny-llama")


def prompt(seed, n=10):
    return torch.randint(3, 5000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("E, d", [(1, 1), (2, 3), (3, 4), (5, 2), (5, 8)])
def test_self_speculative_equals_full_depth(model, E, d):
    for seed in range(4):
        ids = prompt(seed)
        full = generate(model, [ids], 24, stop_at_eos=False).tokens[0].tolist()
        spec = self_speculative(model, ids, 24, E, d, stop_at_eos=False)
        assert spec.sequences()[0] == full
        accepted, drafted = int(spec.counts["accepted"].sum()), int(spec.counts["drafted"].sum())
        assert 0 <= accepted <= drafted == int(spec.rounds[0]) * d


def test_acceptance_is_total_when_draft_is_the_model(model):
    """With E = L − 1 on a model whose last layer is removed from the draft, acceptance can be < 1;
    but scripted agreement is checkable: drafting with E = L-1 on a copy whose last layer is the
    identity accepts everything."""
    import copy
    m = copy.deepcopy(model)
    last = m.model.layers[-1]
    with torch.no_grad():
        last.self_attn.o_proj.weight.zero_()
        last.mlp.down_proj.weight.zero_()
    L = m.config.num_hidden_layers
    spec = self_speculative(m, prompt(1), 20, L - 1, 4, stop_at_eos=False)
    assert spec.acceptance == 1.0
    assert spec.sequences()[0] == generate(m, [prompt(1)], 20, stop_at_eos=False).tokens[0].tolist()


def test_plain_hf_generate_is_a_peer_of_full_depth(model):
    ids = [prompt(5), prompt(6, 7)]
    full = generate(model, ids, 12, stop_at_eos=False)
    r = decode(model, ids, DecodeConfig.hf_generate(), 12, stop_at_eos=False)
    assert r.tokens.tolist() == full.tokens.tolist() and r.wall_s > 0
    assert DecodeConfig.hf_generate().label == "hf generate (full depth)"
    assert DecodeConfig.hf_generate().key() == {"method": "hf-generate"}
    with pytest.raises(ValueError, match="hf-generate has no field exit_layer; valid: none"):
        DecodeConfig.hf_generate().replace(exit_layer=3)
    # transformers' plain generate runs every layer and the head once for each token it makes: counted as such
    assert (r.counts["layers_run"][r.valid()] == model.config.num_hidden_layers).all()
    assert (r.counts["head_checks"][r.valid()] == 1).all() and r.counts["drafted"].sum() == 0


def test_hf_peer_agrees(model):
    """...and its counters are NaN where it cannot know them (its own drafts, layers and heads per token), never
    0; the prompt pass's are the same as every method's."""
    r = decode(model, [prompt(2)], DecodeConfig.hf_assistant(2, 2), 6, stop_at_eos=False)
    L = model.config.num_hidden_layers
    assert r.counts["layers_run"][0, 0] == L and r.counts["head_checks"][0, 0] == 1
    for c in ("layers_run", "head_checks", "drafted", "accepted"):
        assert r.counts[c][0, 1:].isnan().all(), c
    assert (r.counts["recompute_layers"] == 0).all() and (r.counts["hole_reads"] == 0).all(), "it is exact"
    assert math.isnan(r.acceptance) and math.isnan(r.mean_layers())
    ids = prompt(2)
    full = generate(model, [ids], 16, stop_at_eos=False).tokens[0].tolist()
    r = decode(model, [ids], DecodeConfig.hf_assistant(3, 4), 16, stop_at_eos=False)
    assert r.sequences()[0] == full and r.wall_s > 0


@pytest.mark.parametrize("E, d, match", [(0, 2, "exit_layer"), (6, 2, r"\[1, 5\]"), (3, 0, "draft_len"),
                                         (2.5, 2, "exit_layer")])
def test_bad_arguments(model, E, d, match):
    with pytest.raises(ValueError, match=match):
        self_speculative(model, prompt(0), 8, E, d)


@pytest.fixture(scope="module")
def lm():
    from earlyexit.engine.models import load_model

    return load_model("tiny-llama", device="cpu")   # with its tokenizer, which counts token frequencies


@pytest.mark.parametrize("kw", [{"shortlist": 16}, {"shortlist": 4096}, {"shortlist": 10**9}, {"confidence": 0.2},
                                {"shortlist": 256, "confidence": 0.6}])
def test_shortlist_drafts_and_adaptive_length_stay_lossless(lm, counts_dir, kw):
    """FR-Spec's shortlist head drafts over the most frequent tokens only and confidence stops a round early;
    verification reads the full head, so the output is still the full model's, token for token."""
    ids = [prompt(s) for s in range(3)]
    full = decode(lm, ids, DecodeConfig.full(), 20, stop_at_eos=False).sequences()
    cfg = DecodeConfig.self_speculation(3, 4, **kw)
    r = decode(lm, ids, cfg, 20, stop_at_eos=False)
    assert r.sequences() == full
    calls = r.meta["calls"]["decode"]
    drafts = sum(n for k, n in calls.items() if k.startswith("head:draft"))
    assert drafts == int(r.counts["drafted"].sum())
    if kw.get("shortlist"):
        assert not any(k.startswith("head:draft:") for k in calls), "a shortlist run never drafts with the full head"
    if kw.get("confidence"):
        assert int(r.counts["drafted"].sum()) <= 4 * int(r.rounds.sum())
    else:
        assert int(r.counts["drafted"].sum()) == 4 * int(r.rounds.sum())


def test_shortlist_is_the_most_frequent_tokens_of_the_training_stream(lm, counts_dir):
    from earlyexit.corpus import token_counts
    from earlyexit.engine.adapter import adapter
    from earlyexit.engine.speculative import shortlist_ids

    A = adapter(lm)
    ids = shortlist_ids(lm, A, 100)
    counts = token_counts(lm.tokenizer)
    assert len(ids) == 100 and torch.equal(ids, torch.sort(ids).values)
    inside = counts[ids].min()
    outside = counts[torch.tensor([i for i in range(A.head.weight.shape[0]) if i not in set(ids.tolist())])].max()
    assert inside >= outside
    assert list(counts_dir.glob("token_counts/*.pt")), "the counts are kept for the next call"
    with pytest.raises(ValueError, match="LoadedModel"):
        shortlist_ids(lm.model, A, 100)


def test_drafting_options_are_checked_and_plain_keys_do_not_change():
    assert DecodeConfig.self_speculation(25, 2).key() == {"method": "self-speculation", "E": 25, "d": 2}
    assert DecodeConfig.self_speculation(25, 2, shortlist=8192).label == "self-spec E=25 d=2 K=8192"
    for kw, msg in (({"shortlist": -1}, "shortlist must be"), ({"confidence": 1.0}, "confidence must be"),
                    ({"temperature": 1}, "unknown drafting option")):
        with pytest.raises(ValueError, match=msg):
            DecodeConfig.self_speculation(25, 2, **kw)


@pytest.mark.parametrize("E, skip, d", [(6, (2, 4), 3), (6, (5,), 2), (4, (2,), 4), (6, (3, 4, 5), 1)])
def test_layer_skipping_drafts_stay_lossless_and_never_read_a_hole(model, monkeypatch, E, skip, d):
    """A draft that leaves layers out (the whole model minus ``skip`` when E = L) is verified by the full model
    from the lowest skipped layer up, over the shared cache: the output is the full model's; every layer a draft
    token runs finds every earlier column written at that layer (no hole read), and the layer count charged per
    round is what ran."""
    from earlyexit.engine.cache import HOLE
    from earlyexit.engine.loop import Engine

    L = model.config.num_hidden_layers
    assert E <= L
    seen = []
    orig = Engine.layer

    def layer(self, l, h, rows, cols, *a, **k):
        out = orig(self, l, h, rows, cols, *a, **k)
        last = cols if isinstance(cols, int) else int(cols.max())
        seen.append(bool((self.cache.state[l, 0, :last + 1] == HOLE).any()))
        return out

    monkeypatch.setattr(Engine, "layer", layer)
    for seed in range(3):
        ids = prompt(seed)
        full = generate(model, [ids], 20, stop_at_eos=False).tokens[0].tolist()
        seen.clear()
        r = decode(model, ids, DecodeConfig.self_speculation(E, d, skip=skip), 20, stop_at_eos=False)
        assert r.sequences()[0] == full
        assert seen and not any(seen)
        s0 = min(skip) - 1
        per_round = int(r.counts["layers_run"][0, 1:].sum())
        k = r.counts["drafted"][0]
        rounds = int(r.rounds[0])
        assert per_round == int(k.sum()) * (E - len(skip)) + rounds * s0 + int((k.sum() + rounds)) * (L - s0)


def test_layer_skipping_options_are_checked(model):
    L = model.config.num_hidden_layers
    ids = prompt(0)
    with pytest.raises(ValueError, match=r"exit_layer E must be an int in \[1, 5\]"):
        decode(model, ids, DecodeConfig.self_speculation(L, 2), 8)                  # E = L needs skipped layers
    with pytest.raises(ValueError, match=r"skipped layers must lie in \[1, 5\]"):
        decode(model, ids, DecodeConfig.self_speculation(L, 2, skip=(6,)), 8)
    with pytest.raises(ValueError, match="skip must be distinct layer numbers"):
        DecodeConfig.self_speculation(L, 2, skip=(2, 2))
    assert "skip 2 layers" in DecodeConfig.self_speculation(L, 2, skip=(2, 3)).label


def test_choosing_layers_to_skip_is_greedy_and_measured_right(model):
    """Each step drops the layer whose removal keeps most of the full model's next-token predictions; the
    agreement it reports is what an independent forward pass with those layers left out gives."""
    from earlyexit.engine.speculative import choose_skipped_layers
    from earlyexit.engine.adapter import adapter

    seqs = [prompt(s, 24) for s in range(3)]
    path = choose_skipped_layers(model, seqs, 3)
    assert [p["n_skip"] for p in path] == [0, 1, 2, 3] and path[0]["agreement"] == 1.0
    for a, b in zip(path, path[1:]):
        assert set(a["skip"]) < set(b["skip"])
    A = adapter(model)
    L = A.L

    def agreement(skip):
        with torch.inference_mode():
            x = torch.tensor(seqs)
            h = A.embed(x)
            pos = torch.arange(x.shape[1])[None].expand_as(x)
            cos, sin = A.rope(h, pos)
            full = h
            out = []
            for keep in (range(L), [l for l in range(L) if l + 1 not in skip]):
                h = full
                for l in keep:   # HF's own decoder layer, causal: an independent forward pass
                    h = A.layers[l](h, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))
                    h = h[0] if isinstance(h, tuple) else h
                out.append(A.logits(h).argmax(-1))
            return float((out[0] == out[1]).float().mean())

    for p in path[1:]:
        assert abs(agreement(p["skip"]) - p["agreement"]) < 1e-6, p
    singles = {n: agreement((n,)) for n in range(2, L)}
    assert path[1]["agreement"] == max(singles.values())
    with pytest.raises(ValueError, match="n_skip must be an int in"):
        choose_skipped_layers(model, seqs, 99)

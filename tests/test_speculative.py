"""Self-speculative decoding is lossless: its greedy output is the full model's, for any (E, d)."""
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


def test_hf_peer_agrees(model):
    ids = prompt(2)
    full = generate(model, [ids], 16, stop_at_eos=False).tokens[0].tolist()
    r = decode(model, [ids], DecodeConfig.hf_assistant(3, 4), 16, stop_at_eos=False)
    assert r.sequences()[0] == full and r.wall_s > 0


@pytest.mark.parametrize("E, d, match", [(0, 2, "exit_layer"), (6, 2, r"\[1, 5\]"), (3, 0, "draft_len"),
                                         (2.5, 2, "exit_layer")])
def test_bad_arguments(model, E, d, match):
    with pytest.raises(ValueError, match=match):
        self_speculative(model, prompt(0), 8, E, d)

"""The economize library as a second self-speculation peer: lossless under greedy decoding through our front
door, its drafts and acceptances counted, its options checked."""
import pytest
import torch

from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.models import load_model

pytest.importorskip("economize")


@pytest.fixture(scope="module")
def lm():
    torch.set_num_threads(1)
    return load_model("tiny-llama", device="cpu")


def prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, 5000, (10,), generator=g).tolist() for _ in range(3)]


@pytest.mark.parametrize("E, d, kw", [(3, 2, {}), (5, 4, {}), (6, 3, {"skip": (2, 4)}), (3, 2, {"shortlist": 256}),
                                      (6, 2, {"skip": (3,), "shortlist": 4096})])
def test_economize_equals_full_depth_and_counts_its_drafts(lm, counts_dir, E, d, kw):
    ids = prompts()
    full = decode(lm, ids, DecodeConfig.full(), 16, stop_at_eos=False).sequences()
    r = decode(lm, ids, DecodeConfig.economize(E, d, **kw), 16, stop_at_eos=False)
    assert r.sequences() == full
    drafted, accepted = int(r.counts["drafted"].sum()), int(r.counts["accepted"].sum())
    assert 0 <= accepted <= drafted and drafted > 0 and r.wall_s > 0
    # the model economize was attached to still decodes as before
    assert decode(lm, ids, DecodeConfig.full(), 16, stop_at_eos=False).sequences() == full


def test_economize_options_are_checked():
    cfg = DecodeConfig.economize(25, 2, shortlist=8192)
    assert cfg.label == "economize early_exit E=25 d=2 K=8192"
    assert DecodeConfig.economize(30, 3, skip=(4, 8)).label == "economize layer_skip 2 layers d=3"
    assert cfg.key() == {"method": "economize", "E": 25, "d": 2, "draft_kw": {"shortlist": 8192}}
    with pytest.raises(ValueError, match="valid: shortlist, skip"):
        DecodeConfig.economize(25, 2, confidence=0.5)
    with pytest.raises(ValueError, match="hf-assistant has no field shortlist; valid: exit_layer, draft_len"):
        DecodeConfig.hf_assistant(25, 2).replace(shortlist=8)

"""Larger models by Hugging Face id or local path: the llama1b profile, and the local-folder route end to end on a
checkpoint folder written here."""
from __future__ import annotations

import pytest
import torch

from earlyexit.book import runner
from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.models import embedded_tokenizer, load_model, small_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A Llama 3-style checkpoint folder as the hub serves one: config.json, model.safetensors, tokenizer files."""
    d = tmp_path_factory.mktemp("tiny-llama3-local")
    model = small_model("tiny-llama3", seed=3)
    model.save_pretrained(d, safe_serialization=True)
    embedded_tokenizer().save_pretrained(d)
    return d, model


def test_a_local_folder_loads_and_decodes_like_the_model_it_holds(folder):
    d, model = folder
    assert (d / "config.json").exists() and list(d.glob("*.safetensors")) and (d / "tokenizer.json").exists()
    lm = load_model(str(d), device="cpu")
    assert lm.num_layers == model.config.num_hidden_layers == 4
    assert lm.config.rope_scaling["rope_type"] == "llama3"
    assert len(lm.weights_sha256) == 64 and lm.weights_sha256 == load_model(str(d), device="cpu").weights_sha256
    ids = [lm.tokenizer.encode("def add(a, b):\n    return"), lm.tokenizer.encode("The sky is blue because")]
    got = decode(lm, ids, DecodeConfig.full(), 6, stop_at_eos=False)
    assert got.tokens.shape == (2, 6)
    ref = model.eval()
    for b, p in enumerate(ids):  # the folder's weights, not some other init: greedy tokens of the saved model
        x = torch.tensor([p])
        with torch.no_grad():
            for _ in range(6):
                x = torch.cat([x, ref(x).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert got.sequences()[b] == x[0, len(p):].tolist()
    ee = decode(lm, ids, DecodeConfig.early_exit("softmax", "copy-forward", threshold=0.3, min_layer=2), 6,
                stop_at_eos=False)
    assert ee.tokens.shape == (2, 6)


def test_the_llama1b_profile_is_valid_and_sized_for_16_layers():
    names = runner.toc_notebooks()
    prof = runner.load_profile("llama1b", notebooks=names)
    assert prof.common["device"] == "cuda" and prof.common["model"] == "facebook/layerskip-llama3.2-1B"
    L = 16
    for nb in names:
        p = prof.parameters(nb)
        for k in ("static_layers", "check_layers", "e_mins"):
            assert all(1 <= l <= L for l in p.get(k, [])), (nb, k, p[k])
        assert all(1 <= e <= L - 1 for e in p.get("exit_layers", [])), (nb, p["exit_layers"])
        if "map_prompt" in p:
            assert p["map_prompt"] < p["n_prompts"]


def test_the_gated_hub_model_is_refused_offline_with_the_way_to_allow_it(monkeypatch):
    monkeypatch.delenv("EARLYEXIT_ALLOW_DOWNLOAD", raising=False)
    with pytest.raises(ValueError, match="EARLYEXIT_ALLOW_DOWNLOAD=1"):
        load_model("facebook/layerskip-llama3.2-1B", device="cpu")

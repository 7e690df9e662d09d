"""The model-shape registry (earlyexit.experiments.shapes) and the published self-speculation data."""
import pandas as pd
import pytest

from earlyexit.engine.models import GGUF_NAME, embedded_dir
from earlyexit.experiments.shapes import DTYPE_BYTES, SHAPES, random_model, shape
from earlyexit.paths import REPO_ROOT

CSV = REPO_ROOT / "data" / "published" / "self_speculation.csv"
COLUMNS = ["source", "reference", "model", "task", "hardware", "dtype", "exit_layer", "draft_len", "acceptance",
           "ar_ms_per_token", "spec_ms_per_token", "speedup", "notes"]


@pytest.mark.parametrize("name", list(SHAPES))
def test_parameter_count_matches_published_size(name):
    s = SHAPES[name]
    assert s.published_source and s.source
    assert abs(s.params() / s.published - 1) < 0.05, (name, s.params(), s.published)


def test_exact_counts_of_known_models():
    assert shape("SmolLM2-135M").params() == 134_515_008
    assert shape("Llama-2-7B").params() == 6_738_415_616
    assert shape("Llama-2-70B").layer_params() * 80 + 2 * 32000 * 8192 + 8192 == shape("Llama-2-70B").params()


def test_head_dim_bytes_head_to_layer_and_config():
    from transformers import LlamaConfig

    s = shape("SmolLM2-135M")
    assert s.head_dim == 64 and shape("Llama-2-13B").head_dim == 128
    for dtype, width in DTYPE_BYTES.items():
        assert s.bytes(dtype) == width * s.params()
    with pytest.raises(ValueError, match="float32"):
        s.bytes("int4")
    assert s.head_to_layer() == pytest.approx(49152 * 576 / 3_540_096)
    cfg = LlamaConfig(**shape("Llama-3.2-1B").config(num_hidden_layers=2))
    assert (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.vocab_size, cfg.tie_word_embeddings) == \
        (2, 8, 128256, True)


@pytest.mark.skipif(not (embedded_dir() / GGUF_NAME).exists(), reason="embedded GGUF not fetched")
def test_smollm2_135m_matches_the_embedded_gguf():
    from gguf import GGUFReader

    r = GGUFReader(embedded_dir() / GGUF_NAME)
    meta = {k: f.contents() for k, f in r.fields.items() if k.startswith("llama.")}
    s = shape("SmolLM2-135M")
    assert (meta["llama.block_count"], meta["llama.embedding_length"], meta["llama.feed_forward_length"],
            meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"], meta["llama.vocab_size"],
            meta["llama.rope.dimension_count"], meta["llama.rope.freq_base"]) == \
        (s.layers, s.hidden, s.intermediate, s.heads, s.kv_heads, s.vocab, s.head_dim, s.rope_theta)
    names = [t.name for t in r.tensors]
    assert "output.weight" not in names and s.tied_head  # no separate head tensor: tied
    assert sum(int(t.n_elements) for t in r.tensors) == s.params()


def test_random_model_has_exactly_the_formula_parameters():
    m = random_model("SmolLM2-135M")
    assert m.lm_head.weight is m.model.embed_tokens.weight
    assert sum(p.numel() for p in m.parameters()) == shape("SmolLM2-135M").params()
    q = m.model.layers[0].self_attn.q_proj.weight
    assert q.std().item() == pytest.approx(0.02, rel=0.05) and bool((m.model.norm.weight == 1).all())


def test_random_model_with_fewer_layers_and_determinism():
    m = random_model("SmolLM2-360M", layers=2, dtype="bfloat16")
    s = shape("SmolLM2-360M")
    assert len(m.model.layers) == 2 and m.config.hidden_size == s.hidden
    assert sum(p.numel() for p in m.parameters()) == s.params(layers=2)
    assert str(next(m.parameters()).dtype) == "torch.bfloat16"
    a, b, c = (random_model("SmolLM2-135M", layers=1, seed=k).model.layers[0].mlp.up_proj.weight for k in (3, 3, 4))
    assert bool((a == b).all()) and not bool((a == c).all())
    with pytest.raises(ValueError, match="between 1 and 32"):
        random_model("SmolLM2-360M", layers=40)


def test_unknown_name_is_refused_with_the_list():
    with pytest.raises(ValueError) as e:
        shape("SmolLM-135M")
    assert all(n in str(e.value) for n in SHAPES) and "Did you mean 'SmolLM2-135M'" in str(e.value)
    assert shape("llama-2-7b") is SHAPES["Llama-2-7B"]
    with pytest.raises(ValueError, match="registered"):
        random_model("GPT-2")


@pytest.fixture(scope="module")
def table():
    return pd.read_csv(CSV)


def test_csv_columns_and_values(table):
    assert list(table.columns) == COLUMNS
    assert set(table.source) == {"layerskip-repo-log", "hf-blog-layerskip", "layerskip-paper"}
    assert table.reference.notna().all() and table.model.notna().all() and table.speedup.notna().all()
    acc = table.acceptance.dropna()
    assert ((acc >= 0) & (acc <= 1)).all()


def test_csv_speedup_is_ar_over_spec(table):
    both = table.dropna(subset=["ar_ms_per_token", "spec_ms_per_token"])
    assert len(both) >= 16
    ratio = both.ar_ms_per_token / both.spec_ms_per_token
    assert ((both.speedup - ratio).abs() <= 1e-3 * ratio).all()


# (exit layer, draft length, acceptance, AR ms/token, self-speculative ms/token) as quoted to us; verified in the logs
QUOTED_LOGS = [(8, 6, 0.795, 25.65, 13.12), (8, 6, 0.654, 28.18, 18.57), (8, 6, 0.627, 25.86, 15.20),
               (8, 6, 0.528, 25.86, 17.62), (8, 6, 0.432, 25.86, 21.37), (8, 12, 0.430, 32.37, 28.94),
               (8, 12, 0.439, 38.29, 36.76), (10, 6, 0.555, 25.47, 19.38), (4, 6, 0.254, 25.22, 21.29),
               (8, 12, 0.019, 23.17, 71.32)]
QUOTED_BLOG = [("Llama-3.2-1B", 4, 17.9, 9.96), ("Llama-2-7B", 4, 25.83, 19.91), ("Llama-3-8B", 4, 28.87, 15.75),
               ("Llama-2-13B", 4, 32.95, 33.11), ("Llama-2-13B", 8, 33.55, 19.22), ("Llama-2-70B", 10, 113.2, 54.96)]


def test_csv_holds_every_quoted_measurement(table):
    logs = table[table.source == "layerskip-repo-log"]
    for E, d, acc, ar, spec in QUOTED_LOGS:  # quoted to 3 and 2 decimals
        hit = logs[(logs.exit_layer == E) & (logs.draft_len == d) & ((logs.acceptance - acc).abs() < 5e-4)
                   & ((logs.ar_ms_per_token - ar).abs() < 5e-3) & ((logs.spec_ms_per_token - spec).abs() < 5e-3)]
        assert len(hit) == 1, (E, d, acc)
    blog = table[table.source == "hf-blog-layerskip"]
    for model, E, ar, spec in QUOTED_BLOG:
        hit = blog[(blog.model.str.split(" (", regex=False).str[0] == model) & (blog.exit_layer == E)
                   & (blog.ar_ms_per_token == ar) & (blog.spec_ms_per_token == spec)]
        assert len(hit) == 1, (model, E)
    folded = {k.lower(): k for k in SHAPES}
    for model in table.model:  # "<architecture> (<checkpoint>)": a registered architecture is spelled as registered
        base = model.split(" (")[0]
        assert folded.get(base.lower(), base) == base, model
    assert set(blog.model.str.split(" (", regex=False).str[0]) <= set(SHAPES)

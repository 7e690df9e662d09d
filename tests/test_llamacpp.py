"""The llama.cpp peer (engine.llamacpp): GGUF conversion with the gguf package, tested on a small file written
here; llama.cpp's own decoding, where the optional extra is installed, equal token for token to the engine's float32
on the embedded model's F32 copy (the same weights, dequantized from the same Q4_1 blocks)."""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from earlyexit.engine import llamacpp  # noqa: E402
from earlyexit.engine.llamacpp import PRECISIONS, convert_gguf, gguf_bytes  # noqa: E402


def small_gguf(path):
    """A GGUF with one Q4_1 matrix, one F32 norm and a few metadata fields (a string, an int, an array)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_key_value("general.name", "small", gguf.GGUFValueType.STRING)
    writer.add_key_value(gguf.Keys.General.FILE_TYPE, 3, gguf.GGUFValueType.UINT32)
    writer.add_key_value("llama.block_count", 1, gguf.GGUFValueType.UINT32)
    writer.add_key_value("tokenizer.ggml.tokens", ["a", "b"], gguf.GGUFValueType.ARRAY,
                         sub_type=gguf.GGUFValueType.STRING)
    writer.add_tensor("blk.0.ffn_up.weight", gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1),
                      raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tensors(path):
    r = gguf.GGUFReader(str(path))
    return r, {t.name: (t.tensor_type, gguf.quants.dequantize(t.data, t.tensor_type)) for t in r.tensors}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_conversion_keeps_the_weights_and_the_metadata(tmp_path, precision):
    src = small_gguf(tmp_path / "small.Q4_1.gguf")
    dst = convert_gguf(src, tmp_path / "out" / f"small.{precision}.gguf", precision)
    r0, t0 = tensors(src)
    r1, t1 = tensors(dst)
    assert r1.fields["general.name"].contents() == "small"
    assert r1.fields["tokenizer.ggml.tokens"].contents() == ["a", "b"]
    assert r1.fields["general.file_type"].contents() == {"F32": 0, "BF16": 32, "Q8_0": 7}[precision]
    w0, w1 = t0["blk.0.ffn_up.weight"][1], t1["blk.0.ffn_up.weight"][1]
    assert t1["blk.0.ffn_up.weight"][0].name == precision and w1.shape == w0.shape == (8, 64)
    assert t1["blk.0.attn_norm.weight"][0].name == "F32"            # one-dimensional tensors stay F32
    err = {"F32": 0.0, "BF16": 2 ** -8, "Q8_0": 1 / 127}[precision] * float(np.abs(w0).max())
    assert float(np.abs(w1 - w0).max()) <= err
    bpw = {"F32": 4, "BF16": 2, "Q8_0": 34 / 32}[precision]
    assert gguf_bytes(dst) == int(8 * 64 * bpw) + 64 * 4
    assert not list((tmp_path / "out").glob("*.part"))


def test_a_bad_precision_is_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="choose one of F32, BF16, Q8_0"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "x.gguf", "Q2_K")


@pytest.mark.embedded
@pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is an optional extra (make llama-cpp)")
def test_llama_cpp_at_f32_decodes_what_the_engine_decodes_in_float32(tmp_path):
    from earlyexit.engine import DecodeConfig, decode, load_model
    from earlyexit.engine.models import GGUF_NAME, embedded_dir
    lm = load_model("smollm2-135m")
    f32 = convert_gguf(embedded_dir() / GGUF_NAME, tmp_path / "smollm2.F32.gguf", "F32")
    peer = llamacpp.LlamaCpp(f32, threads=1)
    for text in ("The capital of France is", "def fibonacci(n):"):
        ids = lm.tokenizer.encode(text)
        ours = decode(lm, [ids], DecodeConfig.full(), 24, stop_at_eos=False).tokens[0].tolist()
        assert peer.greedy(ids, 24)[0] == ours

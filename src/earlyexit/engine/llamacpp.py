"""llama.cpp as the CPU peer of the engine: the runtime a reader who decodes the embedded GGUF on a CPU would pick.

It is an optional extra (``make llama-cpp`` builds ``llama-cpp-python`` from its sdist with the machine's cmake
and C compiler); nothing in the book or its tests needs it. Two pieces:

- :func:`convert_gguf` rewrites a GGUF at another precision with the ``gguf`` package: every tensor dequantized
  (the embedded model is Q4_1) and written as F32, BF16 or Q8_0, the metadata copied. Dequantized Q4_1 in F32 is
  exactly the weights the engine decodes in float32 (transformers dequantizes the same blocks), so the two can be
  compared token for token.
- :class:`LlamaCpp` decodes greedily, token by token from Python, batch 1, from prompt token ids (the engine's
  own, so both read the same prompts), and times it: ``tokens, seconds = LlamaCpp(path, threads=1).greedy(ids, 64)``.

    from earlyexit.engine.llamacpp import convert_gguf, gguf_bytes, LlamaCpp
    f32 = convert_gguf(q41_path, out_dir / "model.F32.gguf", "F32")
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

PRECISIONS = ("F32", "BF16", "Q8_0")   # what convert_gguf writes (the embedded file itself is Q4_1)
_FILE_TYPE = {"F32": 0, "BF16": 32, "Q8_0": 7}   # gguf's LlamaFileType for general.file_type


def gguf_bytes(path) -> int:
    """Bytes of tensor data in a GGUF file: what a batch-1 decoding step reads once per token (the tied head is
    the embedding table, stored once)."""
    from gguf import GGUFReader
    return int(sum(t.n_bytes for t in GGUFReader(str(path)).tensors))


def convert_gguf(src, dst, precision: str) -> Path:
    """Write ``src`` (any GGUF the ``gguf`` package can dequantize) to ``dst`` at ``precision`` (one of
    :data:`PRECISIONS`): each tensor dequantized to float32, then stored as F32, BF16 or Q8_0 (one-dimensional
    tensors, the norms, stay F32 as llama.cpp's own converter keeps them). Skips the work when ``dst`` exists
    and is newer than ``src``; writes through a temporary file, so an interrupted run leaves no half file."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    import gguf
    from gguf import GGMLQuantizationType as Q
    src, dst = Path(src), Path(dst)
    if dst.exists() and dst.stat().st_mtime >= src.stat().st_mtime:
        return dst
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".part")
    writer = gguf.GGUFWriter(str(tmp), arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = _FILE_TYPE[precision] if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    qtype = {"F32": Q.F32, "BF16": Q.BF16, "Q8_0": Q.Q8_0}[precision]
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if w.ndim == 1 or qtype == Q.F32:
            writer.add_tensor(t.name, w)
        else:
            q = gguf.quants.quantize(w, qtype)
            writer.add_tensor(t.name, q, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, dst)
    return dst


def available() -> bool:
    """Whether ``llama_cpp`` (the optional extra) imports here."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


class LlamaCpp:
    """A GGUF loaded by llama.cpp (through ``llama-cpp-python``) for greedy batch-1 decoding on ``threads``
    CPU threads, with a context of ``n_ctx`` tokens."""

    def __init__(self, path, threads: int = 1, n_ctx: int = 512):
        try:
            from llama_cpp import Llama
        except ImportError as e:
            raise ImportError("the llama.cpp peer needs llama-cpp-python, an optional extra that builds from "
                              "source (about 7 minutes on 2 cores): make llama-cpp") from e
        self.path = Path(path)
        self.threads = threads
        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                         n_batch=n_ctx, logits_all=False, verbose=False)

    def greedy(self, ids: list[int], n: int) -> tuple[list[int], float]:
        """The ``n`` tokens greedy decoding appends to ``ids`` (no stop at end-of-sequence), and the seconds it
        took, prompt pass included, as the engine's timings are."""
        import llama_cpp
        llm = self.llm
        llm.reset()
        out = []
        vocab = llm.n_vocab()
        t0 = time.perf_counter()
        llm.eval(list(ids))
        for i in range(n):
            # the last position's logits, read in place (llama-cpp-python keeps them only with logits_all)
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
            tok = int(np.argmax(row))
            out.append(tok)
            if i + 1 < n:
                llm.eval([tok])
        return out, time.perf_counter() - t0

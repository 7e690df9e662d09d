"""The texts: Python's standard library source and its documentation topics, split by a fixed rule into an
evaluation and a training part, and the training stream of token blocks (see :mod:`earlyexit.corpus`)."""
from __future__ import annotations

import functools
import os
import random
import sys
import sysconfig
import tokenize
import zlib
from typing import Iterator, Sequence

import torch


SPLITS: tuple[str, ...] = ("eval", "train")



EXCLUDED_DIRS = frozenset({
    "site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__",
    "pydoc_data", "encodings", "ensurepip", "__phello__",
})



def split_of(name: str) -> str:
    """``"eval"`` iff ``crc32(name) % 5 == 0`` else ``"train"`` (``name``: a module's POSIX path
    relative to the stdlib root, or a pydoc topic name)."""
    return "eval" if zlib.crc32(name.encode("utf-8")) % 5 == 0 else "train"



def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")



def python_version() -> str:
    return ".".join(map(str, sys.version_info[:3]))



def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]



@functools.lru_cache(maxsize=1)
def stdlib_modules() -> tuple[tuple[str, str], ...]:
    """All used stdlib files as sorted ``(relative POSIX path, source text)`` pairs.

    Read with ``tokenize.open`` (honours coding cookies; newlines normalised to ``\\n``);
    files that cannot be decoded are skipped."""
    root = stdlib_root()
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        parts = [] if rel == "." else rel.split(os.sep)
        if any(p in EXCLUDED_DIRS or p.startswith("config-") for p in parts):
            dirnames[:] = []
            continue
        paths += ["/".join(parts + [f]) for f in filenames if f.endswith(".py")]
    out = []
    for rel in sorted(paths):
        try:
            with tokenize.open(os.path.join(root, *rel.split("/"))) as fh:
                out.append((rel, fh.read()))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
    return tuple(out)



@functools.lru_cache(maxsize=1)
def pydoc_topics() -> tuple[tuple[str, str], ...]:
    """Python's documentation topics as sorted ``(name, text)`` pairs."""
    from pydoc_data.topics import topics

    return tuple(sorted(topics.items()))



def training_documents(split: str = "train") -> list[tuple[str, str]]:
    """``(name, text)`` of every document of ``split``: stdlib files (``"stdlib/<path>"``) then
    pydoc topics (``"pydoc/<topic>"``), in sorted order."""
    _check_split(split)
    docs = [(f"stdlib/{p}", t) for p, t in stdlib_modules() if split_of(p) == split]
    docs += [(f"pydoc/{k}", t) for k, t in pydoc_topics() if split_of(k) == split]
    return docs



def training_texts(split: str = "train") -> Iterator[str]:
    """Yield the texts of :func:`training_documents` (``split="train"`` for LayerSkip training)."""
    for _, text in training_documents(split):
        yield text



class _CorpusIndex:
    """Exact "is this string a substring of some document?" for many queries.

    A query ``l0 \\n l1 \\n ... \\n lm`` can only occur in a document if its inner lines
    ``l1..l(m-1)`` are whole lines of that document, so a set of whole lines rules out almost
    every query; the rest are checked with a plain ``in`` on the documents."""

    def __init__(self, texts: Sequence[str]):
        self.texts = list(texts)
        self.lines = {line for t in self.texts for line in t.split("\n")}

    def __contains__(self, query: str) -> bool:
        inner = query.split("\n")[1:-1]
        if inner and max(inner, key=len) not in self.lines:
            return False
        return any(query in t for t in self.texts)



@functools.lru_cache(maxsize=1)
def _train_index() -> _CorpusIndex:
    return _CorpusIndex(list(training_texts("train")))



def _ids(text: str, tokenizer) -> list[int]:
    # The chat template already contains its special tokens; never add BOS/EOS twice.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])



def token_stream(tokenizer, seq_len: int, seed: int, split: str = "train", *,
                 epochs: int | None = 1, sep_id: int | None = None) -> Iterator[torch.Tensor]:
    """Blocks of ``seq_len`` token ids (``torch.long``, shape ``(seq_len,)``) for training.

    Each epoch shuffles the documents of :func:`training_documents` with
    ``random.Random(seed + epoch)``, tokenizes them lazily, appends ``sep_id`` (default: the
    tokenizer's EOS) after each, concatenates, and cuts consecutive blocks; the final partial
    block of an epoch carries over into the next one (and is dropped after the last epoch).
    ``epochs=None`` repeats forever."""
    if seq_len < 1:
        raise ValueError("seq_len must be >= 1")
    sep = tokenizer.eos_token_id if sep_id is None else sep_id
    if sep is None:
        raise ValueError("the tokenizer has no EOS token; pass sep_id")
    texts = [t for _, t in training_documents(split)]
    buf: list[int] = []
    epoch = 0
    while epochs is None or epoch < epochs:
        order = list(range(len(texts)))
        random.Random(seed + epoch).shuffle(order)
        for i in order:
            buf += _ids(texts[i], tokenizer) + [sep]
            while len(buf) >= seq_len:
                yield torch.tensor(buf[:seq_len], dtype=torch.long)
                buf = buf[seq_len:]
        epoch += 1



def token_counts(tokenizer, n_tokens: int = 1 << 20, seed: int = 0) -> torch.Tensor:
    """How often each token id occurs in the first ``n_tokens`` tokens of the training stream (``torch.long``,
    one count per id of the tokenizer's vocabulary). Kept on disk under the result cache, keyed by the
    tokenizer's vocabulary, ``n_tokens``, ``seed`` and the corpus (Python version), so a second call reads it."""
    import hashlib
    import io

    from .. import paths
    from ..files import atomic_write_bytes

    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    h = hashlib.sha256(repr((vocab, n_tokens, seed, python_version())).encode()).hexdigest()[:16]
    path = paths.CACHE / "token_counts" / f"{h}.pt"
    if path.exists():
        return torch.load(path, weights_only=True)
    size = max(len(tokenizer), max(i for _, i in vocab) + 1)
    counts = torch.zeros(size, dtype=torch.long)
    seen = 0
    for block in token_stream(tokenizer, 1024, seed, split="train", epochs=None):
        take = block[: n_tokens - seen]
        counts += torch.bincount(take, minlength=size)
        seen += len(take)
        if seen >= n_tokens:
            break
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(counts, buf)
    atomic_write_bytes(path, buf.getvalue())
    return counts

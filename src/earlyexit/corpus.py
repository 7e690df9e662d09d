"""Prompt sets and a training corpus that are available offline and deterministic by seed.

Three kinds of text, all shipped with Python itself or written here:

* **code** -- functions from Python's standard library source (``sysconfig.get_paths()["stdlib"]``).
  The prompt is the function's signature line(s) plus its docstring, exactly as in the source
  (indentation included, no decorators); the reference is the real body that follows the docstring.
* **prose** -- passages of Python's documentation topics (``pydoc_data.topics.topics``).
  The prompt is the first ``k`` sentences of a paragraph; the reference is the text that follows.
* **instruction** -- a fixed list of short requests (:data:`INSTRUCTIONS`) rendered through the
  tokenizer's chat template with ``add_generation_prompt=True``.  They have no reference: their
  quality is measured against the full-depth model's own answer.

Held-out rule (fixed, documented, never tuned)
----------------------------------------------
A stdlib module (its POSIX path relative to the stdlib root, e.g. ``"json/encoder.py"``) or a
pydoc topic (its name, e.g. ``"lists"``) belongs to the **eval** split iff
``zlib.crc32(name.encode("utf-8")) % 5 == 0``, otherwise to **train**.  Evaluation prompts come
only from eval modules/topics; the LayerSkip training stream (:func:`token_stream`) only from
train ones.  In addition an eval candidate whose prompt text occurs verbatim anywhere in the
training corpus (the stdlib contains a few copied functions) is dropped, so no evaluation prompt
is ever seen in training.

Which part of the stdlib is used: every ``*.py`` file under the stdlib root except directories
named in :data:`EXCLUDED_DIRS` (tests, third-party ``site-packages``, the codec tables in
``encodings`` and ``pydoc_data``, whose ``topics.py`` *is* the prose corpus).

Determinism: candidates are built from sorted paths / topic names, then
``random.Random(seed).sample`` picks ``n`` of them.  The stdlib and the pydoc topics differ
between Python versions, so the prompts are identical across runs and machines *with the same
Python version*; :func:`load_prompts` returns a :class:`PromptSet` whose ``meta`` records that
version and a hash of the prompts.

Token budget: :func:`encode` keeps the *end* of a prompt that is longer than ``max_prompt_tokens``
(left truncation), because the continuation depends on the last tokens (the docstring's closing
quotes, the last sentence).  To avoid cut prompts altogether pass ``tokenizer`` and
``max_prompt_tokens`` to :func:`load_prompts`, which then drops over-long candidates *before*
sampling (deterministic given the tokenizer).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import random
import re
import sys
import sysconfig
import tokenize
import zlib
from dataclasses import dataclass
from typing import Iterator, Literal, Sequence

import torch

Kind = Literal["code", "prose", "instruction"]
KINDS: tuple[str, ...] = ("code", "prose", "instruction")
MIX = "mix"  # all three kinds; also "code+prose" etc.
SPLITS: tuple[str, ...] = ("eval", "train")

EXCLUDED_DIRS = frozenset({
    "site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__",
    "pydoc_data", "encodings", "ensurepip", "__phello__",
})

# Code candidates: body (lines after the docstring, up to the function's last line) and prompt sizes.
MIN_BODY_LINES, MAX_BODY_LINES = 3, 40
MAX_PROMPT_LINES = 40
# Prose candidates.
MIN_PROSE_PROMPT_CHARS, MIN_PROSE_REFERENCE_CHARS = 60, 200


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt.  ``text + reference`` is a contiguous piece of the source
    (before the reference is trimmed); ``reference`` is ``""`` for instructions."""

    id: str
    kind: Kind
    text: str
    reference: str
    source: str


class PromptSet(list):
    """A ``list[Prompt]`` with a ``meta`` dict (kind, n, seed, split, Python version, hash)."""

    def __init__(self, prompts: Sequence[Prompt] = (), meta: dict | None = None):
        super().__init__(prompts)
        self.meta = dict(meta or {})


# --------------------------------------------------------------------------- split rule

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


# --------------------------------------------------------------------------- raw corpora

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


# --------------------------------------------------------------------------- leakage guard

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


# --------------------------------------------------------------------------- code

def _lines(src: str) -> list[str]:
    """Split on ``\\n`` only, keeping the ends (``str.splitlines`` would also split on form feeds
    and disagree with ``ast`` line numbers)."""
    parts = src.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """Top-level functions and methods of top-level classes, with their qualified names."""
    fdef = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, fdef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, fdef):
                    yield f"{node.name}.{sub.name}", sub


def _code_candidates_of(rel: str, src: str) -> Iterator[Prompt]:
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return
    lines = _lines(src)
    for qualname, fn in _functions(tree):
        if len(fn.body) < 2 or ast.get_docstring(fn, clean=False) is None:
            continue
        doc, first = fn.body[0], fn.body[1]
        # the docstring on its own line(s), the body starting on a later line
        if doc.lineno <= fn.lineno or first.lineno <= doc.end_lineno:
            continue
        if lines[doc.lineno - 1][: doc.col_offset].strip():
            continue
        prompt_lines = lines[fn.lineno - 1: doc.end_lineno]
        body_lines = lines[doc.end_lineno: fn.end_lineno]
        if not MIN_BODY_LINES <= len(body_lines) <= MAX_BODY_LINES or len(prompt_lines) > MAX_PROMPT_LINES:
            continue
        yield Prompt(
            id=f"code:{rel}:{fn.lineno}:{qualname}",
            kind="code",
            text="".join(prompt_lines),
            reference="".join(body_lines),
            source=f"python-{python_version()} stdlib {rel} lines {fn.lineno}-{fn.end_lineno}",
        )


@functools.lru_cache(maxsize=2)
def code_candidates(split: str = "eval") -> tuple[Prompt, ...]:
    """All code candidates of ``split`` in sorted order (path, line), deduplicated by prompt
    text; eval candidates whose prompt occurs in the training corpus are dropped."""
    _check_split(split)
    seen, out = set(), []
    for rel, src in stdlib_modules():
        if split_of(rel) != split:
            continue
        for p in _code_candidates_of(rel, src):
            if p.text not in seen:
                seen.add(p.text)
                out.append(p)
    if split == "eval":
        index = _train_index()
        out = [p for p in out if p.text not in index]
    return tuple(out)


def _sample(candidates: Sequence[Prompt], n: int, seed: int, what: str) -> list[Prompt]:
    if not 0 <= n <= len(candidates):
        raise ValueError(f"asked for n={n} {what} prompts, only {len(candidates)} available")
    return random.Random(seed).sample(list(candidates), n)


def code_prompts(n: int, seed: int, split: str = "eval") -> list[Prompt]:
    """``n`` code prompts drawn by ``random.Random(seed).sample`` from :func:`code_candidates`."""
    return _sample(code_candidates(split), n, seed, f"code/{split}")


# --------------------------------------------------------------------------- prose

_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "Mr.", "Dr.", "No.", "Fig.", "approx.")
_SENTENCE_END = re.compile(r"""[.!?]["')\]]?(?=\s+["'(\[]?[A-Z0-9])""")


def sentence_ends(text: str) -> list[int]:
    """Character offsets just after each sentence end in ``text`` (a period/!/? optionally
    followed by a closing quote or bracket, then whitespace and a capital/digit; common
    abbreviations such as "e.g." are not sentence ends).  The end of ``text`` counts too."""
    ends = []
    for m in _SENTENCE_END.finditer(text):
        if text[: m.start() + 1].endswith(_ABBREVIATIONS):
            continue
        ends.append(m.end())
    if text.rstrip() and (not ends or ends[-1] < len(text.rstrip())):
        ends.append(len(text.rstrip()))
    return ends


def _trim(text: str, max_chars: int) -> str:
    """``text`` cut to at most ``max_chars`` at a whitespace boundary."""
    if len(text) <= max_chars:
        return text
    cut = text[: max_chars + 1]
    i = max(cut.rfind(" "), cut.rfind("\n"))
    return cut[:i] if i > 0 else text[:max_chars]


def _is_prose_paragraph(par: str) -> bool:
    lines = par.split("\n")
    if not par or not par[0].isupper() or par[0].isspace():
        return False
    # headings are underlined with a row of * = - ...; bullet/table/grammar blocks are skipped
    if any(line and set(line) <= set("*=-+^~|") for line in lines):
        return False
    return not any(line.startswith((" ", "* ", "- ", "+-")) for line in lines)


def _prose_candidates_of(name: str, text: str, sentences: int, max_reference_chars: int) -> Iterator[Prompt]:
    """Non-overlapping windows of ``sentences`` sentences (starting at sentence 0, k, 2k, ...)
    inside each prose paragraph; the reference is the rest of the topic after the window."""
    pos = 0
    for i, par in enumerate(text.split("\n\n")):
        par_start, pos = pos, pos + len(par) + 2
        if not _is_prose_paragraph(par):
            continue
        ends = sentence_ends(par)
        for j in range(0, len(ends) - sentences + 1, sentences):
            a = 0 if j == 0 else ends[j - 1]
            a += len(par[a:]) - len(par[a:].lstrip())
            start, stop = par_start + a, par_start + ends[j + sentences - 1]
            prompt, rest = text[start:stop], text[stop:]
            if len(prompt) < MIN_PROSE_PROMPT_CHARS or len(rest.strip()) < MIN_PROSE_REFERENCE_CHARS:
                continue
            yield Prompt(
                id=f"prose:{name}:{i}:{j}",
                kind="prose",
                text=prompt,
                reference=_trim(rest, max_reference_chars),
                source=f"python-{python_version()} pydoc_data.topics[{name!r}] paragraph {i} sentence {j}",
            )


@functools.lru_cache(maxsize=8)
def prose_candidates(split: str = "eval", sentences: int = 2, max_reference_chars: int = 600) -> tuple[Prompt, ...]:
    """All prose candidates of ``split`` (windows of ``sentences`` sentences in prose paragraphs,
    see :func:`_prose_candidates_of`) in sorted order; eval candidates whose prompt occurs in
    the training corpus are dropped."""
    _check_split(split)
    if sentences < 1:
        raise ValueError("sentences must be >= 1")
    out = []
    for name, text in pydoc_topics():
        if split_of(name) == split:
            out += _prose_candidates_of(name, text, sentences, max_reference_chars)
    if split == "eval":
        index = _train_index()
        out = [p for p in out if p.text not in index]
    return tuple(out)


def prose_prompts(n: int, seed: int, split: str = "eval", sentences: int = 2,
                  max_reference_chars: int = 600) -> list[Prompt]:
    """``n`` prose prompts: ``sentences`` consecutive sentences of a documentation paragraph
    (the paragraph's first ones, or the next non-overlapping window); the reference is the
    text that follows, cut to ``max_reference_chars`` at a word boundary."""
    return _sample(prose_candidates(split, sentences, max_reference_chars), n, seed, f"prose/{split}")


# --------------------------------------------------------------------------- instructions

INSTRUCTIONS: tuple[str, ...] = (
    "Name three primary colours.",
    "Explain what a hash table is in one sentence.",
    "What is the capital of France?",
    "Give two reasons to drink water.",
    "Write a haiku about autumn.",
    "What does CPU stand for?",
    "List the days of the week.",
    "Explain recursion to a child in two sentences.",
    "Translate 'good morning' into Spanish.",
    "What is 12 multiplied by 7?",
    "Suggest a name for a pet goldfish.",
    "Describe the water cycle briefly.",
    "Write a Python function that returns the square of a number.",
    "What is the boiling point of water in Celsius?",
    "Give one tip for getting better sleep.",
    "Why is the sky blue? Answer in one sentence.",
    "Name the largest planet in the solar system.",
    "Write a short thank-you note to a teacher.",
    "What is the difference between a list and a tuple in Python?",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "List three fruits that are red.",
    "What is photosynthesis?",
    "Give an example of a prime number greater than ten.",
    "Explain what a variable is in programming.",
    "Write one sentence about the ocean.",
    "How many minutes are in three hours?",
    "Name two musical instruments with strings.",
    "What is the opposite of 'ancient'?",
    "Give a synonym for 'happy'.",
    "Describe a cat in three words.",
    "What does HTML stand for?",
    "Explain what gravity does in one sentence.",
)


def render_instruction(request: str, tokenizer) -> str:
    """``request`` as a single user turn through the tokenizer's chat template, ending with the
    assistant header (``add_generation_prompt=True``).  SmolLM2's template adds its default
    system message."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the tokenizer has no chat template; instruction prompts need one")
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": request}], tokenize=False, add_generation_prompt=True)


def instruction_prompts(n: int, seed: int, tokenizer) -> list[Prompt]:
    """``n`` of :data:`INSTRUCTIONS` (picked by seed) rendered with the chat template.
    Instructions have no train/eval split (they never enter the training stream)."""
    chosen = _sample(range(len(INSTRUCTIONS)), n, seed, "instruction")
    return [Prompt(id=f"instruction:{i:02d}", kind="instruction",
                   text=render_instruction(INSTRUCTIONS[i], tokenizer), reference="",
                   source=f"earlyexit.data.INSTRUCTIONS[{i}]") for i in chosen]


# --------------------------------------------------------------------------- uniform entry point

def _parse_kinds(kind_or_mix: str) -> list[str]:
    kinds = list(KINDS) if kind_or_mix == MIX else kind_or_mix.split("+")
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds or len(set(kinds)) != len(kinds):
        raise ValueError(f"unknown prompt kind {kind_or_mix!r}: valid kinds are {', '.join(KINDS)}, "
                         f"{MIX!r} (all three) or a '+'-joined subset such as 'code+prose'")
    return kinds


def _fits(p: Prompt, tokenizer, max_prompt_tokens: int | None) -> bool:
    return max_prompt_tokens is None or len(_ids(p.text, tokenizer)) <= max_prompt_tokens


def load_prompts(kind_or_mix: str, n: int, seed: int, split: str = "eval", *, tokenizer=None,
                 max_prompt_tokens: int | None = None) -> PromptSet:
    """``n`` prompts of one kind (``"code"``, ``"prose"``, ``"instruction"``) or a mix
    (``"mix"`` = all three, or e.g. ``"code+prose"``).

    A mix splits ``n`` as evenly as possible over its kinds (the first kinds get the remainder)
    and lists the prompts grouped by kind in the order given.  ``tokenizer`` is required for
    instructions and, with ``max_prompt_tokens``, drops longer candidates before sampling."""
    kinds = _parse_kinds(kind_or_mix)
    _check_split(split)
    if ("instruction" in kinds or max_prompt_tokens is not None) and tokenizer is None:
        raise ValueError("a tokenizer is needed for instruction prompts and for max_prompt_tokens")
    counts = [n // len(kinds) + (i < n % len(kinds)) for i in range(len(kinds))]
    prompts: list[Prompt] = []
    for kind, k in zip(kinds, counts):
        if kind == "code":
            cands = code_candidates(split)
        elif kind == "prose":
            cands = prose_candidates(split)
        else:
            cands = instruction_prompts(len(INSTRUCTIONS), 0, tokenizer)
            cands = sorted(cands, key=lambda p: p.id)
        cands = [p for p in cands if _fits(p, tokenizer, max_prompt_tokens)]
        prompts += _sample(cands, k, seed, f"{kind}/{split}")
    meta = {
        "kind": kind_or_mix, "n": n, "seed": seed, "split": split,
        "max_prompt_tokens": max_prompt_tokens, "python_version": python_version(),
        "split_rule": "zlib.crc32(name) % 5 == 0 -> eval",
        "sha256": hashlib.sha256("\0".join(p.id + "\0" + p.text + "\0" + p.reference
                                           for p in prompts).encode()).hexdigest(),
    }
    return PromptSet(prompts, meta)


# --------------------------------------------------------------------------- tokens

def _ids(text: str, tokenizer) -> list[int]:
    # The chat template already contains its special tokens; never add BOS/EOS twice.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode(prompts: Sequence[Prompt], tokenizer, max_prompt_tokens: int | None = None) -> list[list[int]]:
    """Token ids of each prompt (no special tokens added).  A prompt longer than
    ``max_prompt_tokens`` keeps its *last* ``max_prompt_tokens`` tokens (left truncation), so it
    still ends where the reference begins; the number of prompts never changes."""
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise ValueError("max_prompt_tokens must be >= 1")
    out = []
    for p in prompts:
        ids = _ids(p.text, tokenizer)
        out.append(ids[-max_prompt_tokens:] if max_prompt_tokens else ids)
    return out


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

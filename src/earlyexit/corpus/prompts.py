"""Evaluation prompts drawn from the evaluation part of the texts: code, prose and instructions, each with
its reference where there is one (see :mod:`earlyexit.corpus`)."""
from __future__ import annotations

import ast
import functools
import hashlib
import random
import re
from dataclasses import dataclass
from typing import Iterator, Literal, Sequence


from .sources import _check_split, _ids, _train_index, pydoc_topics, python_version, split_of, stdlib_modules

Kind = Literal["code", "prose", "instruction"]



KINDS: tuple[str, ...] = ("code", "prose", "instruction")



MIX = "mix"  # all three kinds; also "code+prose" etc.



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
                   source=f"earlyexit.corpus.prompts.INSTRUCTIONS[{i}]") for i in chosen]



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


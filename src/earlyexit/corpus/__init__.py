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

from .prompts import (INSTRUCTIONS, KINDS, MAX_BODY_LINES, MAX_PROMPT_LINES, MIN_BODY_LINES, MIX, Kind, Prompt,
                      PromptSet, _lines, code_candidates, code_prompts, encode, instruction_prompts, load_prompts,
                      prose_candidates, prose_prompts, render_instruction, sentence_ends)
from .sources import (EXCLUDED_DIRS, SPLITS, pydoc_topics, python_version, split_of, stdlib_modules, stdlib_root,
                      token_counts, token_stream, training_documents, training_texts)

__all__ = [
    "INSTRUCTIONS", "KINDS", "MAX_BODY_LINES", "MAX_PROMPT_LINES", "MIN_BODY_LINES", "MIX", "Kind", "Prompt",
    "PromptSet", "_lines", "code_candidates", "code_prompts", "encode", "instruction_prompts", "load_prompts",
    "prose_candidates", "prose_prompts", "render_instruction", "sentence_ends", "EXCLUDED_DIRS", "SPLITS", "token_counts",
    "pydoc_topics", "python_version", "split_of", "stdlib_modules", "stdlib_root", "token_stream",
    "training_documents", "training_texts",
]

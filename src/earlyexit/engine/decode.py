"""The front door: one call decodes with any method and returns one :class:`~earlyexit.engine.config.Result`.

    from earlyexit.engine import DecodeConfig, decode
    r = decode(lm, prompts, DecodeConfig.early_exit("softmax", "copy-forward", threshold=0.9, min_layer=15), 32)
    r.sequences(), r.exit_layer, r.counts["copied_kv"], r.state
    r = decode(lm, prompts, DecodeConfig.self_speculation(exit_layer=25, draft_len=2), 32)
    r.acceptance

Every argument is checked before any compute; an error names the valid range or options.
"""
from __future__ import annotations

import torch

from .adapter import adapter
from .config import DecodeConfig
from .result import Result


def _prompts(prompts, vocab: int) -> list[list[int]]:
    if isinstance(prompts, torch.Tensor):
        prompts = prompts.tolist()
    if prompts and isinstance(prompts[0], int):
        prompts = [prompts]
    if not prompts or any(not p for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    if any(not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in p) for p in prompts):
        raise ValueError(f"prompt token ids must be ints in [0, {vocab})")
    return [list(p) for p in prompts]


def decode(lm, prompts, config: DecodeConfig, max_new_tokens: int, *, stop_at_eos: bool = True, force=None,
           return_logits: bool = False, return_kv: bool = False, flush: bool = False, progress: bool = False,
           audit_weights: bool = False) -> Result:
    """Greedy decoding of ``prompts`` (a token-id list, or a list of them) with ``config``.

    ``lm`` is a LoadedModel, a Hugging Face Llama-family causal LM, or an Adapter. Early exit decodes the
    prompts as one batch; self-speculation and the transformers peer decode them one after another (the
    result's ``meta["wall_s_rows"]`` holds each prompt's time).

    ``DecodeConfig.hf_generate()`` runs transformers' own greedy ``generate`` instead (the peer of full depth).
    The configuration decides how it decodes (its ``run``); this function checks what every method shares.

    Options (early exit only): ``force`` (B, N) token ids fed back instead of the predictions (teacher
    forcing); ``return_logits`` keeps every step's logits; ``audit_weights`` measures the softmax mass on
    holes (slow); ``flush`` does lazy recompute's deferred work after the last step (not timed) so that the
    cache, ``flushed_state`` and ``kv`` are what it would end with. ``return_kv`` returns the final K/V.
    """
    A = adapter(lm)
    cfg = A.config
    L = A.L
    if not isinstance(config, DecodeConfig):
        raise ValueError(f"config must be a DecodeConfig (DecodeConfig.early_exit(...), .self_speculation(...), "
                         f".hf_assistant(...)), got {type(config).__name__}")
    prompts = _prompts(prompts, A.vocab)
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    P, N = max(len(p) for p in prompts), max_new_tokens
    extra = config.extra_columns
    limit = A.context_limit
    if P + N + extra > limit:
        raise ValueError(f"prompt ({P} tokens) + max_new_tokens ({N})" + (" + draft_len + 1" if extra else "")
                         + f" = {P + N + extra} exceeds the model's context of {limit} tokens; valid: at most "
                         f"{limit} in total")
    pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else 0
    eos = cfg.eos_token_id if stop_at_eos else None
    eos_set = set(eos if isinstance(eos, (list, tuple)) else [eos]) if eos is not None else set()

    A.for_inference()
    config.check(L)
    return config.run(A, lm, prompts, N, pad_id=pad_id, eos_set=eos_set, stop_at_eos=stop_at_eos, progress=progress,
                      force=force, return_logits=return_logits, return_kv=return_kv, flush=flush,
                      audit_weights=audit_weights)


def full_depth(lm, prompts, max_new_tokens: int, **kw) -> Result:
    """:func:`decode` with the full model (every token runs every layer)."""
    return decode(lm, prompts, DecodeConfig.full(), max_new_tokens, **kw)


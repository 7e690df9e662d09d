"""The front door: one call decodes with any method and returns one :class:`~earlyexit.engine.config.Result`.

    from earlyexit.engine import DecodeConfig, decode
    r = decode(lm, prompts, DecodeConfig.early_exit("softmax", "copy-forward", threshold=0.9, min_layer=15), 32)
    r.sequences(), r.exit_layer, r.counts["copied_kv"], r.state
    r = decode(lm, prompts, DecodeConfig.self_speculation(exit_layer=25, draft_len=2), 32)
    r.acceptance

Every argument is checked before any compute; an error names the valid range or options.
"""
from __future__ import annotations

from collections import Counter

import torch

from .adapter import adapter
from .cache import PAD
from .config import COUNTERS, DecodeConfig, Result
from .fill import make_strategy
from .loop import early_exit
from .rules import make_rule
from .peers import economize_decode
from .speculative import check_draft, hf_assistant_early_exit, hf_generate, self_speculative, shortlist_ids


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
    B, P, N = len(prompts), max(len(p) for p in prompts), max_new_tokens
    extra = 0 if config.method in ("early-exit", "hf-generate") else (config.draft_len or 0) + 1
    limit = A.context_limit
    if P + N + extra > limit:
        raise ValueError(f"prompt ({P} tokens) + max_new_tokens ({N})" + (" + draft_len + 1" if extra else "")
                         + f" = {P + N + extra} exceeds the model's context of {limit} tokens; valid: at most "
                         f"{limit} in total")
    pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else 0
    eos = cfg.eos_token_id if stop_at_eos else None
    eos_set = set(eos if isinstance(eos, (list, tuple)) else [eos]) if eos is not None else set()

    A.for_inference()
    if config.method == "early-exit":
        rule = make_rule(config.rule, L, **config.args)
        rule.bind(A)
        strategy = make_strategy(config.strategy)
        if force is not None:
            force = torch.as_tensor(force, dtype=torch.long)
            if force.dim() == 1:
                force = force[None]
            if force.shape != (B, N):
                raise ValueError(f"force must have shape (B, max_new_tokens) = {(B, N)}, got {tuple(force.shape)}")
        return early_exit(A, prompts, N, rule, strategy, config, pad_id=pad_id, eos_set=eos_set, force=force,
                          return_logits=return_logits, return_kv=return_kv, flush=flush, progress=progress,
                          audit_weights=audit_weights)

    unsupported = [k for k, v in (("force", force is not None), ("return_logits", return_logits),
                                  ("return_kv", return_kv), ("flush", flush), ("audit_weights", audit_weights)) if v]
    if unsupported:
        raise ValueError(f"{', '.join(unsupported)} apply to early-exit decoding only, not to {config.method}")
    draft_kw = config.args
    if config.method != "hf-generate":
        check_draft(L, config.exit_layer, config.draft_len, tuple(draft_kw.get("skip", ())))
    short = shortlist_ids(lm, A, draft_kw["shortlist"]) if draft_kw.get("shortlist") else None
    tokens = torch.full((B, N), pad_id, dtype=torch.long)
    counts = {c: torch.zeros(B, N) for c in COUNTERS}
    n_new = torch.zeros(B, dtype=torch.long)
    rounds = torch.zeros(B, dtype=torch.long)
    walls = []
    calls = {"prefill": Counter(), "decode": Counter()}
    C = P + N + extra
    state = torch.full((L, B, C), PAD, dtype=torch.uint8)
    for b, p in enumerate(prompts):
        if config.method == "self-speculation":
            sp = self_speculative(A, p, N, config.exit_layer, config.draft_len, eos_set=eos_set, progress=progress,
                                  shortlist=short, confidence=float(draft_kw.get("confidence", 0.0)),
                                  skip=tuple(draft_kw.get("skip", ())))
            toks, wall = sp.tokens, sp.wall_s
            for i, t in enumerate(sp.round_start):
                counts["layers_run"][b, t] += sp.layers[i]
                counts["head_checks"][b, t] += sp.heads[i]
                counts["drafted"][b, t] += sp.drafted[i]
                counts["accepted"][b, t] += sp.accepted[i]
            rounds[b] = len(sp.round_start)
            for ph, c in sp.calls.items():
                calls[ph].update(c)
            state[:, b, P - len(p):] = sp.state             # the shared cache is len(p) + N + d + 1 long
        elif config.method == "economize":
            toks, wall, dr, ac = economize_decode(A.model, p, N, config.exit_layer, config.draft_len,
                                                  skip=tuple(draft_kw.get("skip", ())), shortlist=short,
                                                  eos_id=sorted(eos_set) or None)
            counts["drafted"][b, 0], counts["accepted"][b, 0] = dr, ac
            state = None
        elif config.method == "hf-generate":
            toks, wall = hf_generate(A.model, p, N, stop_at_eos=stop_at_eos)
            state = None
        else:
            toks, wall = hf_assistant_early_exit(A.model, p, N, config.exit_layer, config.draft_len,
                                                 stop_at_eos=stop_at_eos)
            state = None
        counts["layers_run"][b, 0] = L
        counts["head_checks"][b, 0] = 1
        tokens[b, : len(toks)] = torch.tensor(toks, dtype=torch.long)
        n_new[b] = len(toks)
        walls.append(wall)
    pad = torch.tensor([P - len(p) for p in prompts])
    return Result(config=config, tokens=tokens, n_new=n_new, exit_layer=torch.full((B, N), L, dtype=torch.long),
                  counts=counts, state=state, col_exit=None, prompt_len=P, pad=pad, num_layers=L,
                  wall_s=float(sum(walls)), rounds=rounds if config.method == "self-speculation" else None,
                  meta={"wall_s_rows": walls, "calls": {ph: dict(sorted(c.items())) for ph, c in calls.items()}})


def full_depth(lm, prompts, max_new_tokens: int, **kw) -> Result:
    """:func:`decode` with the full model (every token runs every layer)."""
    return decode(lm, prompts, DecodeConfig.full(), max_new_tokens, **kw)


"""A second peer for self-speculation: the ``economize`` library (PyPI ``economize``, Apache-2.0), which attaches
drafters to an unmodified Hugging Face model and verifies their drafts with the full model, losslessly under
greedy decoding.

Its drafters that match this book's: ``early_exit`` (LayerSkip's draft, the first E layers and the shared head),
``layer_skip`` (the whole model minus a set of layers, no training) and ``frspec`` (either of them drafting over
a shortlist of token ids). Unlike :func:`earlyexit.engine.speculative.self_speculative`, its verification reruns
the round's tokens through all L layers (it keeps no exit-query cache), over one cache it preallocates.

    toks, wall, drafted, accepted = economize_decode(model, prompt, 32, exit_layer=25, draft_len=2)
"""
from __future__ import annotations

import weakref

import torch

from ..clock import now

_ATTACHED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # model -> {options: economized model}


def _economized(model, exit_layer: int, draft_len: int, skip: tuple, shortlist: tuple | None):
    try:
        import economize
        from economize.techniques.early_exit import EarlyExitConfig
        from economize.techniques.frspec import FRSpecConfig
        from economize.techniques.layer_skip import LayerSkipConfig
    except ImportError as e:  # pragma: no cover - the lock installs it
        raise ImportError("the economize peer needs the economize package: pip install economize==0.3.2 "
                          "(its own dependencies are torch, transformers, safetensors, huggingface_hub)") from e
    key = (exit_layer, draft_len, skip, shortlist)
    per_model = _ATTACHED.setdefault(model, {})
    if key not in per_model:
        drafter = (LayerSkipConfig(skip_layers=tuple(sorted(skip))) if skip else
                   EarlyExitConfig(exit_layer=exit_layer, head="shared", adaptation="frozen"))
        cfg = FRSpecConfig(drafter=drafter, vocab_size=len(shortlist), token_ids=shortlist) if shortlist else drafter
        per_model[key] = economize.apply(model, cfg, decoding=economize.DecodeConfig(cycle_length=draft_len + 1))
    return per_model[key]


@torch.inference_mode()
def economize_decode(model, prompt: list[int], max_new_tokens: int, exit_layer: int, draft_len: int, *,
                     skip: tuple = (), shortlist=None, eos_id=None) -> tuple[list[int], float, int, int]:
    """Greedy speculative decoding of one prompt with economize: ``early_exit`` from layer ``exit_layer``, or
    with ``skip`` (layer numbers, 1-based) its ``layer_skip`` drafter; ``shortlist`` (token ids) wraps either in
    ``frspec``. ``draft_len`` drafts a round (economize's ``cycle_length`` is ``draft_len + 1``). Stops after
    ``eos_id`` when given. Returns (tokens, wall seconds, drafted, accepted); the economized model is attached
    once per model and options and reused."""
    short = tuple(int(t) for t in shortlist) if shortlist is not None else None
    em = _economized(model, exit_layer, draft_len, tuple(skip), short)
    dev = next(model.parameters()).device
    ids = torch.tensor(prompt, device=dev)
    t0 = now(dev)
    res = em.decode(ids, max_new_tokens, stop=eos_id)
    wall = now(dev) - t0
    drafted = sum(int(k) for k, _ in res.acceptance)
    accepted = sum(int(a) for _, a in res.acceptance)
    return [int(t) for t in res.tokens.tolist()], wall, drafted, accepted

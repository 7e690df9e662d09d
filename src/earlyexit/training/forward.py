"""The forward pass the recipe trains through, and what the book measures before and after training.

:func:`forward_layers` runs a Llama-family model layer by layer with Hugging Face's own decoder layers (and
masks), dropping layers per sequence in training; :func:`early_exit_loss` reads every enabled layer through
the final norm and the shared head (:func:`exit_logits`); :func:`per_layer_agreement` scores each layer's
exit against the last layer's on held-out text. The model's pieces come from one
:class:`~earlyexit.engine.adapter.Adapter`.
"""
from __future__ import annotations

import inspect
import math
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F

from ..engine.adapter import adapter


def _attention_masks(model, h: torch.Tensor, position_ids: torch.Tensor) -> list:
    """One causal mask per layer, built by transformers' own mask functions so every attention
    implementation gets what it expects (``None`` for SDPA without padding: its kernel runs with
    ``is_causal=True``; an explicit additive mask for eager). Sliding-window layers (Mistral, Qwen2
    ``layer_types``) get the sliding mask."""
    from transformers import masking_utils as mu

    cfg = model.config
    kw = dict(config=cfg, inputs_embeds=h, attention_mask=None, past_key_values=None,
              position_ids=position_ids)
    if "cache_position" in inspect.signature(mu.create_causal_mask).parameters:  # transformers < 5.2x
        kw["cache_position"] = torch.arange(h.shape[1], device=h.device)
    n = adapter(model).L
    types = getattr(cfg, "layer_types", None)
    if types is None:
        sliding = getattr(cfg, "sliding_window", None) is not None and cfg.model_type == "mistral"
        types = ["sliding_attention" if sliding else "full_attention"] * n
    masks = {}
    if "full_attention" in types:
        masks["full_attention"] = mu.create_causal_mask(**kw)
    if "sliding_attention" in types:
        masks["sliding_attention"] = mu.create_sliding_window_causal_mask(**kw)
    return [masks[t] for t in types[:n]]


def forward_layers(model, input_ids: torch.Tensor, collect: Iterable[int] | None = None,
                   drop_rates: torch.Tensor | None = None,
                   generator: torch.Generator | None = None,
                   rows: tuple[int, int, int] | None = None) -> dict[int, torch.Tensor]:
    """Run the decoder layer by layer; return ``{l: x_{l+1}}``, the residual stream after layer ``l``
    (before the final norm), for each ``l`` in ``collect`` (default: every layer).

    With ``drop_rates`` (one probability per layer) and ``model.training`` True, each sequence of the
    batch skips layer ``l`` with probability ``drop_rates[l]``, drawn from ``generator`` on the CPU (so the
    draws do not depend on the device). A layer runs only on the sequences that keep it (``index_select``
    then ``index_copy`` back); the others carry their residual stream through unchanged. In eval mode no
    layer is dropped. With dropout off this equals ``model(input_ids)`` (tested to 1e-4 in fp32).

    ``rows = (start, stop, global_batch)`` says that ``input_ids`` are rows ``start..stop-1`` of a larger batch
    (one process's share under torch.distributed): the coins are drawn for the whole global batch, in the same
    order as in one process, and this slice keeps its own.
    """
    A = adapter(model)
    model, L = A.model, A.L
    want = set(range(L)) if collect is None else set(collect)
    B, T = input_ids.shape
    h = A.embed(input_ids)
    position_ids = torch.arange(T, device=h.device).unsqueeze(0)
    cos_sin = A.rope(h, position_ids)
    masks = _attention_masks(model, h, position_ids)
    dropping = drop_rates is not None and model.training
    out: dict[int, torch.Tensor] = {}
    for l, layer in enumerate(A.layers):
        mask = masks[l]
        if dropping and float(drop_rates[l]) > 0:
            coins = torch.rand(B if rows is None else rows[2], generator=generator)
            keep = (coins if rows is None else coins[rows[0]:rows[1]]) >= float(drop_rates[l])
            n_keep = int(keep.sum())
        else:
            keep, n_keep = None, B
        if n_keep == B:
            h = layer(h, attention_mask=mask, position_ids=position_ids, position_embeddings=cos_sin)
        elif n_keep > 0:
            idx = keep.nonzero().squeeze(1).to(h.device)
            sub_mask = mask.index_select(0, idx) if isinstance(mask, torch.Tensor) and mask.shape[0] == B \
                and B > 1 else mask
            h_kept = layer(h.index_select(0, idx), attention_mask=sub_mask, position_ids=position_ids,
                           position_embeddings=cos_sin)
            h = h.index_copy(0, idx, h_kept)
        elif rows is not None:
            # n_keep == 0 in one process's share: the layer still runs (on one row, its output weighted by
            # zero, so h is unchanged) because every process must take part in the layer's collective
            # operations (DDP's gradient average, FSDP's gathers), whatever rows its own share keeps
            m1 = mask[:1] if isinstance(mask, torch.Tensor) and mask.shape[0] == B and B > 1 else mask
            ghost = layer(h[:1], attention_mask=m1, position_ids=position_ids, position_embeddings=cos_sin)
            h = h + 0.0 * (ghost[0] if isinstance(ghost, tuple) else ghost).sum()
        # otherwise (n_keep == 0 in one process) the whole batch skips this layer
        if isinstance(h, tuple):  # older decoder layers return (hidden_states, ...)
            h = h[0]
        if l in want:
            out[l] = h
    return out


def exit_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """``head(norm(x))``: a layer's residual stream through the model's final norm and shared LM head."""
    return adapter(model).logits(hidden)


def _exit_ce(model, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = exit_logits(model, hidden)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _exit_distill(model, hidden: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a layer's exit against the soft targets ``soft`` (probabilities, detached)."""
    logp = F.log_softmax(exit_logits(model, hidden).float(), dim=-1)
    return -(soft * logp).sum(-1).mean()


def early_exit_loss(model, input_ids: torch.Tensor, layers: Sequence[int], weights: torch.Tensor,
                    drop_rates: torch.Tensor | None = None, generator: torch.Generator | None = None,
                    checkpoint_head: bool = False,
                    rows: tuple[int, int, int] | None = None,
                    target: str = "data") -> tuple[torch.Tensor, dict[int, float]]:
    """``J = Σ_l ẽ_l · CE(head(norm(x_{l+1}))[:, :-1], input_ids[:, 1:])`` over the enabled ``layers``.

    ``target="distill"``: every enabled layer below the last learns the last layer's distribution on the same
    batch (detached soft targets) instead of the data's next token; the last layer still learns the data.
    Returns the weighted loss (a scalar with grad) and each layer's loss as a float (its CE against its own
    target). ``rows``: see :func:`forward_layers`.
    """
    layers = list(layers)
    last = adapter(model).L - 1
    want = sorted(set(layers) | ({last} if target == "distill" else set()))
    hs = forward_layers(model, input_ids, collect=want, drop_rates=drop_rates, generator=generator, rows=rows)
    targets = input_ids[:, 1:]
    soft = None
    if target == "distill":
        with torch.no_grad():
            soft = torch.softmax(exit_logits(model, hs[last][:, :-1]).float(), dim=-1)
    total = 0.0
    per_layer = {}
    for l, w in zip(layers, weights.tolist()):
        x = hs[l][:, :-1]
        fn, y = (_exit_distill, soft) if soft is not None and l != last else (_exit_ce, targets)
        if checkpoint_head and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint
            ce = checkpoint(fn, model, x, y, use_reentrant=False)
        else:
            ce = fn(model, x, y)
        per_layer[l] = float(ce.detach())
        if w != 0:
            total = total + w * ce
    return total, per_layer


@torch.no_grad()
def per_layer_agreement(model, blocks):
    """For held-out token blocks, per layer ``l`` (0-based; exiting after layer ``l`` runs ``l + 1`` layers):

    * ``agreement``: fraction of positions where ``argmax head(norm(x_{l+1}))`` equals the last layer's
      argmax (1 at the last layer);
    * ``loss``: mean cross-entropy of that exit against the true next token; ``ppl = exp(loss)``.

    ``blocks`` is a LongTensor ``(n, T)`` or an iterable of such tensors (batches); positions
    ``0..T-2`` of each block are scored (the last has no next token). Runs in eval mode (no layer dropout)
    and restores the model's mode afterwards.
    """
    import pandas as pd

    A = adapter(model)
    model, L, device = A.model, A.L, A.device
    if isinstance(blocks, torch.Tensor):
        blocks = [blocks if blocks.dim() == 2 else blocks.unsqueeze(0)]
    agree = torch.zeros(L, dtype=torch.float64)
    nll = torch.zeros(L, dtype=torch.float64)
    count = 0
    was_training = model.training
    model.eval()
    try:
        for ids in blocks:
            ids = torch.as_tensor(ids, dtype=torch.long).to(device)
            if ids.dim() == 1:
                ids = ids.unsqueeze(0)
            if ids.shape[1] < 2:
                raise ValueError("held-out blocks need at least 2 tokens each")
            hs = forward_layers(model, ids)
            targets = ids[:, 1:].reshape(-1)
            final = exit_logits(model, hs[L - 1][:, :-1]).argmax(-1).reshape(-1)
            for l in range(L):
                logits = exit_logits(model, hs[l][:, :-1]).float()
                logits = logits.reshape(-1, logits.shape[-1])
                agree[l] += (logits.argmax(-1) == final).sum().item()
                nll[l] += F.cross_entropy(logits, targets, reduction="sum").item()
            count += targets.numel()
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("no held-out blocks given")
    loss = (nll / count).tolist()
    return pd.DataFrame({"layer": list(range(L)), "agreement": (agree / count).tolist(), "loss": loss,
                         "ppl": [math.exp(x) for x in loss]})


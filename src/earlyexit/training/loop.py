"""The LayerSkip training recipe (Elhoushi et al., 2024, "LayerSkip: Enabling Early Exit Inference and
Self-Speculative Decoding", arXiv:2404.16710), on a Hugging Face Llama-family causal LM.

The recipe has two parts (paper §4.1 and §4.2), and a plain baseline is trained by the same loop with both
switched off (``TrainConfig(recipe=False)``: no layer dropout, loss on the last layer only).

**Layer dropout** (§4.1). In training, layer ``l`` of ``L`` (``l = 0..L-1``) is skipped, independently for
each sequence of the batch, with probability

    p_l = p_max · D(l),   D(l) = e^{l·ln 2/(L-1)} - 1 = 2^{l/(L-1)} - 1,

so ``p_0 = 0`` and ``p_{L-1} = p_max`` (the paper's time curriculum ``S(t)`` is taken as 1, its setting for
continual pre-training). A skipped layer is the identity for that sequence: the residual stream passes
through unchanged (no 1/(1-p) rescaling). Off in eval mode.

**Early-exit loss** (§4.2). Every layer's output goes through the model's own final norm and the *shared*
LM head, and the loss is

    J = Σ_l ẽ(t, l) · CE(head(norm(x_{l+1})), y),   ẽ(t, l) = C(t, l)·e(l) / Σ_i C(t, i)·e(i),

where ``C(t, l) ∈ {0, 1}`` is the curriculum (is layer ``l`` given an exit loss at step ``t``?) and ``e(l)``
the per-layer scale. The paper's scale is ``e(l) = e_scale · Σ_{i=0}^{l} i`` for ``l < L-1`` and
``e(L-1) = (L-1) + Σ_{i=0}^{L-2} i`` (the last layer's loss is not multiplied by ``e_scale``). We offer

    "uniform":  e(l) ∝ 1
    "linear":   e(l) ∝ l + 1
    "sum":      e(l) ∝ Σ_{i=0}^{l} (i + 1) = (l + 1)(l + 2)/2     (the paper's cumulative sum)

each multiplied by ``e_scale`` for ``l < L-1`` and normalised over the enabled layers so the weights sum to 1.
The ``i + 1`` (layer *count* rather than index) keeps layer 0's weight non-zero; it equals the paper's form for
layer count ``l + 1`` and matches torchtune's ``sum_l`` when every layer is enabled.

Curricula ``C(t, l)`` (§4.2): ``"none"`` (every layer, every step); ``"rotational"`` with period ``R``
(layers with ``(l + t) mod R == 0``, rotating with the step, plus the last layer); ``"gradual"`` with
period ``k`` (the last layer, plus one more layer from the top every ``k`` steps). The last layer always
has its loss.

Public API: :class:`TrainConfig`, :func:`train`, :func:`per_layer_agreement`, and the pieces the book
plots or tests: :func:`layer_dropout_rates`, :func:`exit_loss_weights`, :func:`curriculum_layers`,
:func:`forward_layers`, :func:`exit_logits`, :func:`early_exit_loss`, :func:`lr_at`, :func:`latest_checkpoint`,
:func:`load_checkpoint_weights`.
"""
from __future__ import annotations

import inspect
import json
import math
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F

SCALES = ("uniform", "linear", "sum")
CURRICULA = ("none", "rotational", "gradual")
SCHEDULES = ("cosine", "linear", "constant")
DEFAULT_ROTATION = 4  # R of the rotational curriculum when curriculum_param is None

# Config fields that may change between an interrupted run and its resumption without changing the math.
_RESUME_FREE = ("checkpoint_every", "keep_checkpoints")


# --------------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------------
@dataclass
class TrainConfig:
    """Everything a training run depends on (besides the model and the data function).

    steps, batch_size, seq_len
        Optimizer steps; sequences per batch and tokens per sequence that ``blocks(step)`` must return
        (a LongTensor of shape ``(batch_size, seq_len)``; the loss is on its ``seq_len - 1`` next tokens).
    lr, warmup, schedule, min_lr_ratio
        Peak learning rate, linear warm-up steps, then ``"cosine"`` / ``"linear"`` decay to
        ``min_lr_ratio · lr`` at the last step, or ``"constant"``.
    weight_decay, betas, grad_clip
        AdamW (decay on matrices only, not on norm gains); global grad-norm clip (0 disables).
    p_max
        Layer dropout rate of the last layer, in [0, 1); ``p_l = p_max·(2^{l/(L-1)} - 1)``.
    e_scale
        Early-exit loss scale of the layers below the last one, ≥ 0 (the paper's ``e_scale``).
    scale
        ``e(l)``: one of ``"uniform"``, ``"linear"``, ``"sum"``.
    curriculum, curriculum_param
        ``"none"``, ``"rotational"`` (param R ≥ 1, default 4) or ``"gradual"`` (param k ≥ 1 steps per
        newly enabled layer; default: spread the layers evenly over ``steps``).
    recipe
        False trains the plain baseline with the same loop: no layer dropout, last-layer loss only.
    seed
        Seeds ``torch.manual_seed`` and the layer-dropout ``torch.Generator``.
    checkpoint_every, keep_checkpoints
        Write a checkpoint every N steps (0: only at the end) and keep the newest ``keep_checkpoints``.
    checkpoint_exit_head
        Recompute each layer's head + cross-entropy in the backward pass (``torch.utils.checkpoint``) rather
        than storing a ``(batch, seq, vocab)`` log-softmax per exit layer: about +1/3 head compute for a
        large memory saving. Worth it on GPU with big batches; off by default.
    amp
        Autocast to bfloat16 on CUDA (weights and optimizer stay in the model's dtype). Ignored on CPU.
    train_embeddings
        False freezes the (tied) embedding / LM head (``requires_grad_(False)``, in place): saves its weight
        gradient on every exit head and its AdamW state. The default trains everything, as LayerSkip does.
    """

    steps: int = 100
    batch_size: int = 4
    seq_len: int = 256
    lr: float = 1e-4
    p_max: float = 0.1
    e_scale: float = 1.0
    scale: str = "sum"
    curriculum: str = "rotational"
    curriculum_param: int | None = None
    seed: int = 0
    warmup: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    recipe: bool = True
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    checkpoint_exit_head: bool = False
    amp: bool = True
    train_embeddings: bool = True

    def __post_init__(self):
        def need(ok: bool, msg: str):
            if not ok:
                raise ValueError(msg)

        def is_int(x) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        for name in ("steps", "batch_size"):
            need(is_int(getattr(self, name)) and getattr(self, name) >= 1,
                 f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        need(is_int(self.seq_len) and self.seq_len >= 2,
             f"seq_len must be an integer >= 2 (one input and one next token), got {self.seq_len!r}")
        need(isinstance(self.lr, (int, float)) and 0 < self.lr < 1, f"lr must be in (0, 1), got {self.lr!r}")
        need(isinstance(self.p_max, (int, float)) and 0 <= self.p_max < 1,
             f"p_max must be in [0, 1), got {self.p_max!r}")
        need(isinstance(self.e_scale, (int, float)) and self.e_scale >= 0 and math.isfinite(self.e_scale),
             f"e_scale must be a finite number >= 0, got {self.e_scale!r}")
        need(self.scale in SCALES, f"unknown scale {self.scale!r}; valid: {', '.join(SCALES)}")
        need(self.curriculum in CURRICULA,
             f"unknown curriculum {self.curriculum!r}; valid: {', '.join(CURRICULA)}")
        need(self.curriculum_param is None or (is_int(self.curriculum_param) and self.curriculum_param >= 1),
             f"curriculum_param must be None or an integer >= 1 (R for 'rotational', k steps for "
             f"'gradual'), got {self.curriculum_param!r}")
        need(self.schedule in SCHEDULES, f"unknown schedule {self.schedule!r}; valid: {', '.join(SCHEDULES)}")
        need(is_int(self.warmup) and 0 <= self.warmup, f"warmup must be an integer >= 0, got {self.warmup!r}")
        need(isinstance(self.min_lr_ratio, (int, float)) and 0 <= self.min_lr_ratio <= 1,
             f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        need(isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0,
             f"weight_decay must be >= 0, got {self.weight_decay!r}")
        need(isinstance(self.grad_clip, (int, float)) and self.grad_clip >= 0,
             f"grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip!r}")
        need(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
             f"betas must be two numbers in [0, 1), got {self.betas!r}")
        self.betas = tuple(float(b) for b in self.betas)
        need(is_int(self.seed), f"seed must be an integer, got {self.seed!r}")
        need(is_int(self.checkpoint_every) and self.checkpoint_every >= 0,
             f"checkpoint_every must be an integer >= 0 (0: only at the end), got {self.checkpoint_every!r}")
        need(is_int(self.keep_checkpoints) and self.keep_checkpoints >= 1,
             f"keep_checkpoints must be an integer >= 1, got {self.keep_checkpoints!r}")

    def resolved_param(self, n_layers: int) -> int | None:
        """The curriculum parameter in use: R for rotational, k for gradual, None for none."""
        if self.curriculum == "rotational":
            return self.curriculum_param or DEFAULT_ROTATION
        if self.curriculum == "gradual":
            return self.curriculum_param or max(1, self.steps // max(1, n_layers - 1))
        return None


# --------------------------------------------------------------------------------------------------------
# The three formulas
# --------------------------------------------------------------------------------------------------------
def layer_dropout_rates(n_layers: int, p_max: float) -> torch.Tensor:
    """``p_l = p_max · (2^{l/(L-1)} - 1)`` for ``l = 0..L-1`` (LayerSkip eq. for D(l), S(t) = 1).

    0 at the first layer, ``p_max`` at the last; a one-layer model gets ``[0]`` (its only layer is also
    its last and must run).
    """
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    if not 0 <= p_max < 1:
        raise ValueError(f"p_max must be in [0, 1), got {p_max}")
    if n_layers == 1:
        return torch.zeros(1, dtype=torch.float64)
    l = torch.arange(n_layers, dtype=torch.float64)
    return p_max * (torch.pow(2.0, l / (n_layers - 1)) - 1.0)


def exit_loss_weights(layers: Sequence[int], n_layers: int, scale: str = "sum",
                      e_scale: float = 1.0) -> torch.Tensor:
    """Normalised early-exit loss weights ``ẽ(t, l) = C(t,l)·e(l) / Σ_i C(t,i)·e(i)`` for the enabled
    ``layers`` (0-based, in the order given).

    ``e(l)`` is ``1`` ("uniform"), ``l + 1`` ("linear") or ``Σ_{i=0}^{l} (i+1)`` ("sum"), times ``e_scale``
    for every layer but the last (``L - 1``). The result sums to 1. If every enabled layer has weight 0
    (``e_scale = 0`` and the last layer not enabled) a ValueError is raised.
    """
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")
    ids = torch.as_tensor(list(layers), dtype=torch.float64)
    if ids.numel() == 0:
        raise ValueError("no layer is enabled for the early-exit loss")
    if ((ids < 0) | (ids >= n_layers)).any():
        raise ValueError(f"layer ids must be in [0, {n_layers - 1}], got {list(layers)}")
    if scale == "uniform":
        e = torch.ones_like(ids)
    elif scale == "linear":
        e = ids + 1
    else:
        e = (ids + 1) * (ids + 2) / 2
    e = e * torch.where(ids < n_layers - 1, torch.tensor(float(e_scale), dtype=torch.float64),
                        torch.tensor(1.0, dtype=torch.float64))
    total = e.sum()
    if total <= 0:
        raise ValueError("all enabled early-exit weights are zero (e_scale = 0 without the last layer)")
    return e / total


def curriculum_layers(curriculum: str, step: int, n_layers: int, param: int | None = None) -> list[int]:
    """Layers (0-based, ascending) that carry an early-exit loss at ``step``: the paper's ``C(t, l) = 1``.

    * ``"none"``: every layer.
    * ``"rotational"`` (``param`` = R, default 4): layers with ``(l + step) % R == 0``, and the last layer.
    * ``"gradual"`` (``param`` = k): layers ``l >= L-1 - step // k``: the last layer at first, one more
      from the top every k steps, until all are enabled.
    """
    L = n_layers
    if curriculum == "none":
        return list(range(L))
    if curriculum == "rotational":
        R = param or DEFAULT_ROTATION
        if R < 1:
            raise ValueError(f"rotational period R must be >= 1, got {R}")
        return sorted({l for l in range(L) if (l + step) % R == 0} | {L - 1})
    if curriculum == "gradual":
        if param is None or param < 1:
            raise ValueError(f"gradual curriculum needs a period k >= 1, got {param!r}")
        lowest = max(0, L - 1 - step // param)
        return list(range(lowest, L))
    raise ValueError(f"unknown curriculum {curriculum!r}; valid: {', '.join(CURRICULA)}")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate at ``step`` (0-based): linear warm-up over ``cfg.warmup`` steps to ``cfg.lr``, then
    cosine / linear decay to ``cfg.min_lr_ratio · cfg.lr`` at the last step (or constant)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, cfg.steps - 1 - cfg.warmup)
    frac = min(1.0, (step - cfg.warmup) / span)
    lo = cfg.lr * cfg.min_lr_ratio
    if cfg.schedule == "cosine":
        return lo + (cfg.lr - lo) * 0.5 * (1 + math.cos(math.pi * frac))
    return cfg.lr - (cfg.lr - lo) * frac


# --------------------------------------------------------------------------------------------------------
# Our own forward over the layers
# --------------------------------------------------------------------------------------------------------
def _decoder(model):
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")) \
            or not hasattr(model, "lm_head"):
        raise ValueError(f"{type(model).__name__} is not a Llama-family causal LM (needs model.model."
                         f"embed_tokens / layers / norm / rotary_emb and model.lm_head)")
    return inner


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
    n = len(_decoder(model).layers)
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
                   generator: torch.Generator | None = None) -> dict[int, torch.Tensor]:
    """Run the decoder layer by layer; return ``{l: x_{l+1}}``, the residual stream after layer ``l``
    (before the final norm), for each ``l`` in ``collect`` (default: every layer).

    With ``drop_rates`` (one probability per layer) and ``model.training`` True, each sequence of the
    batch skips layer ``l`` with probability ``drop_rates[l]``, drawn from ``generator`` on the CPU (so the
    draws do not depend on the device). A layer runs only on the sequences that keep it (``index_select``
    then ``index_copy`` back); the others carry their residual stream through unchanged. In eval mode no
    layer is dropped. With dropout off this equals ``model(input_ids)`` (tested to 1e-4 in fp32).
    """
    inner = _decoder(model)
    L = len(inner.layers)
    want = set(range(L)) if collect is None else set(collect)
    B, T = input_ids.shape
    h = inner.embed_tokens(input_ids)
    position_ids = torch.arange(T, device=h.device).unsqueeze(0)
    cos_sin = inner.rotary_emb(h, position_ids=position_ids)
    masks = _attention_masks(model, h, position_ids)
    dropping = drop_rates is not None and model.training
    out: dict[int, torch.Tensor] = {}
    for l, layer in enumerate(inner.layers):
        mask = masks[l]
        if dropping and float(drop_rates[l]) > 0:
            keep = torch.rand(B, generator=generator) >= float(drop_rates[l])
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
        # n_keep == 0: the whole batch skips this layer
        if isinstance(h, tuple):  # older decoder layers return (hidden_states, ...)
            h = h[0]
        if l in want:
            out[l] = h
    return out


def exit_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """``head(norm(x))``: a layer's residual stream through the model's final norm and shared LM head."""
    inner = _decoder(model)
    return model.lm_head(inner.norm(hidden))


def _exit_ce(model, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = exit_logits(model, hidden)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def early_exit_loss(model, input_ids: torch.Tensor, layers: Sequence[int], weights: torch.Tensor,
                    drop_rates: torch.Tensor | None = None, generator: torch.Generator | None = None,
                    checkpoint_head: bool = False) -> tuple[torch.Tensor, dict[int, float]]:
    """``J = Σ_l ẽ_l · CE(head(norm(x_{l+1}))[:, :-1], input_ids[:, 1:])`` over the enabled ``layers``.

    Returns the weighted loss (a scalar with grad) and each layer's CE as a float.
    """
    layers = list(layers)
    hs = forward_layers(model, input_ids, collect=layers, drop_rates=drop_rates, generator=generator)
    targets = input_ids[:, 1:]
    total = 0.0
    per_layer = {}
    for l, w in zip(layers, weights.tolist()):
        x = hs[l][:, :-1]
        if checkpoint_head and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint
            ce = checkpoint(_exit_ce, model, x, targets, use_reentrant=False)
        else:
            ce = _exit_ce(model, x, targets)
        per_layer[l] = float(ce.detach())
        if w != 0:
            total = total + w * ce
    return total, per_layer


# --------------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------------
_CKPT = re.compile(r"^step_(\d{8})$")


def latest_checkpoint(checkpoint_dir: os.PathLike | None) -> Path | None:
    """The newest complete checkpoint under ``checkpoint_dir`` (``step_NNNNNNNN/``), or None.

    A checkpoint directory only ever appears complete: it is written under a temporary name and moved into
    place with ``os.replace``.
    """
    if checkpoint_dir is None or not Path(checkpoint_dir).is_dir():
        return None
    found = sorted((int(m.group(1)), p) for p in Path(checkpoint_dir).iterdir()
                   if p.is_dir() and (m := _CKPT.match(p.name)))
    return found[-1][1] if found else None


def _save_weights(model, directory: Path) -> None:
    """``model.safetensors`` + ``config.json``, loadable by ``from_pretrained``.

    Not ``save_pretrained``: it refuses models still carrying a quantizer (a GGUF loaded with
    ``gguf_file=`` keeps one although its weights are dequantized). safetensors refuses tensors that share
    storage, so tied weights (``lm_head.weight`` = ``model.embed_tokens.weight``) are written once, under
    their first name; ``from_pretrained`` and :func:`load_checkpoint_weights` tie them again.
    """
    import copy

    from safetensors.torch import save_file

    out, seen = {}, set()
    for k, v in model.state_dict().items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), tuple(v.stride()))
        if key in seen:
            continue
        seen.add(key)
        out[k] = v.detach().contiguous()
    save_file(out, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(directory)


def _save_checkpoint(checkpoint_dir: Path, model, opt, gen: torch.Generator, step: int,
                     cfg: TrainConfig, history: dict) -> Path:
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir / f"step_{step:08d}"
    tmp = Path(tempfile.mkdtemp(dir=checkpoint_dir, prefix=".tmp_step_"))
    try:
        _save_weights(model, tmp)
        state = {"step": step, "optimizer": opt.state_dict(), "dropout_rng": gen.get_state(),
                 "torch_rng": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        torch.save(state, tmp / "train_state.pt")
        (tmp / "train_meta.json").write_text(json.dumps({"step": step, "config": asdict(cfg),
                                                         "history": history}, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    older = sorted(p for p in checkpoint_dir.iterdir() if p.is_dir() and _CKPT.match(p.name))
    stale = [p for p in checkpoint_dir.iterdir() if p.name.startswith(".tmp_step_")]  # from a killed run
    for p in older[:-cfg.keep_checkpoints] + stale:
        shutil.rmtree(p, ignore_errors=True)
    return final


def load_checkpoint_weights(model, ckpt: os.PathLike) -> None:
    """Load a checkpoint's safetensors weights into ``model`` in place (tied weights handled: a key missing
    from the file must share its storage with one that is there)."""
    from safetensors.torch import load_file

    files = sorted(Path(ckpt).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in checkpoint {ckpt}")
    sd = {}
    for f in files:
        sd.update(load_file(f))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected:
        raise ValueError(f"checkpoint {ckpt} does not fit this model: unexpected keys {unexpected[:5]}")
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = {params[k].data_ptr() for k in sd if k in params}
    bad = [k for k in missing if k not in params or params[k].data_ptr() not in loaded]
    if bad:
        raise ValueError(f"checkpoint {ckpt} does not fit this model: missing keys {bad[:5]}")


# --------------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------------
def _param_groups(model, cfg: TrainConfig) -> list[dict]:
    inner = _decoder(model)
    embed = inner.embed_tokens.weight
    head = model.lm_head.weight
    decay, no_decay = [], []
    for p in model.parameters():  # tied parameters appear once
        if not cfg.train_embeddings and (p is embed or p is head):
            p.requires_grad_(False)
            continue
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def train(model, blocks: Callable[[int], torch.Tensor], cfg: TrainConfig,
          checkpoint_dir: os.PathLike | None = None, progress: bool = True) -> dict:
    """Train ``model`` in place with the LayerSkip recipe (or the plain baseline if ``cfg.recipe`` is False).

    ``blocks(step)`` must return the batch of ``step`` deterministically: a LongTensor
    ``(cfg.batch_size, cfg.seq_len)`` of token ids. That, the seeded dropout generator and the saved
    optimizer / RNG state make a resumed run reproduce an uninterrupted one.

    If ``checkpoint_dir`` holds a checkpoint, training resumes after its step (its weights are loaded into
    ``model``; its config must match ``cfg`` except ``checkpoint_every`` / ``keep_checkpoints``). Checkpoints
    are written every ``cfg.checkpoint_every`` steps and after the last step, each as ``step_NNNNNNNN/`` with
    ``model.safetensors`` + ``config.json`` (loadable by ``from_pretrained``), ``train_state.pt`` (optimizer, step, RNG
    states; plain tensors, loadable with ``torch.load(weights_only=True)``) and ``train_meta.json``.

    Returns the history: lists ``step``, ``loss`` (weighted J), ``final_ce`` (last layer's CE), ``lr``,
    ``n_exits`` (layers with a loss), ``seconds``; and ``layer_ce``: one ``{layer: CE}`` dict a step.
    The model is left in the train/eval mode it came in.
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    if not callable(blocks):
        raise TypeError("blocks must be a function step -> LongTensor (batch_size, seq_len)")
    inner = _decoder(model)
    L = len(inner.layers)
    device = next(model.parameters()).device
    param = cfg.resolved_param(L)
    rates = layer_dropout_rates(L, cfg.p_max) if cfg.recipe else None
    torch.manual_seed(cfg.seed)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(cfg.seed)
    # fused AdamW: one kernel over all tensors; on 2 CPU cores ~6x faster than foreach for 135M params
    fused = device.type in ("cpu", "cuda") and all(p.dtype.is_floating_point for p in model.parameters())
    opt = torch.optim.AdamW(_param_groups(model, cfg), lr=cfg.lr, betas=cfg.betas, eps=1e-8,
                            fused=fused or None)
    history = {"step": [], "loss": [], "final_ce": [], "lr": [], "n_exits": [], "seconds": [], "layer_ce": []}
    start = 0

    ckdir = Path(checkpoint_dir) if checkpoint_dir is not None else None
    ck = latest_checkpoint(ckdir)
    if ck is not None:
        meta = json.loads((ck / "train_meta.json").read_text())
        saved, now = meta["config"], json.loads(json.dumps(asdict(cfg)))
        diff = sorted(k for k in set(saved) | set(now) if k not in _RESUME_FREE and saved.get(k) != now.get(k))
        if diff:
            raise ValueError(f"checkpoint {ck} was written with a different config ({', '.join(diff)}); "
                             f"use another checkpoint_dir or the same TrainConfig")
        load_checkpoint_weights(model, ck)
        state = torch.load(ck / "train_state.pt", weights_only=True, map_location="cpu")
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["dropout_rng"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        start = int(state["step"])
        history = meta["history"]
        history["layer_ce"] = [{int(k): v for k, v in d.items()} for d in history["layer_ce"]]

    was_training = model.training
    use_amp = cfg.amp and device.type == "cuda"
    bar = None
    if progress and start < cfg.steps:
        from tqdm.auto import tqdm
        bar = tqdm(total=cfg.steps, initial=start, desc="LayerSkip" if cfg.recipe else "baseline",
                   unit="step")
    try:
        model.train()
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            lr = lr_at(step, cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            ids = blocks(step)
            if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or \
                    tuple(ids.shape) != (cfg.batch_size, cfg.seq_len):
                raise ValueError(f"blocks({step}) must return a LongTensor of shape "
                                 f"({cfg.batch_size}, {cfg.seq_len}), got "
                                 f"{getattr(ids, 'dtype', type(ids))} {tuple(getattr(ids, 'shape', ()))}")
            ids = ids.to(device)
            layers = curriculum_layers(cfg.curriculum, step, L, param) if cfg.recipe else [L - 1]
            weights = exit_loss_weights(layers, L, cfg.scale, cfg.e_scale)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
                loss, per_layer = early_exit_loss(model, ids, layers, weights, drop_rates=rates,
                                                  generator=gen, checkpoint_head=cfg.checkpoint_exit_head)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]],
                                               cfg.grad_clip)
            opt.step()
            dt = time.perf_counter() - t0
            history["step"].append(step)
            history["loss"].append(float(loss.detach()))
            history["final_ce"].append(per_layer[L - 1])
            history["lr"].append(lr)
            history["n_exits"].append(len(layers))
            history["seconds"].append(dt)
            history["layer_ce"].append(per_layer)
            if bar is not None:
                bar.set_postfix(loss=f"{history['loss'][-1]:.3f}", final=f"{per_layer[L - 1]:.3f}",
                                s_step=f"{dt:.1f}")
                bar.update(1)
            done = step + 1
            if ckdir is not None and (done == cfg.steps or (cfg.checkpoint_every and
                                                            done % cfg.checkpoint_every == 0)):
                _save_checkpoint(ckdir, model, opt, gen, done, cfg, history)
    finally:
        if bar is not None:
            bar.close()
        model.train(was_training)
    return history


# --------------------------------------------------------------------------------------------------------
# Evaluation: what the book plots before / after training
# --------------------------------------------------------------------------------------------------------
@torch.no_grad()
def per_layer_agreement(model, blocks) -> "pandas.DataFrame":
    """For held-out token blocks, per layer ``l`` (0-based; exiting after layer ``l`` runs ``l + 1`` layers):

    * ``agreement``: fraction of positions where ``argmax head(norm(x_{l+1}))`` equals the last layer's
      argmax (1 at the last layer);
    * ``loss``: mean cross-entropy of that exit against the true next token; ``ppl = exp(loss)``.

    ``blocks`` is a LongTensor ``(n, T)`` or an iterable of such tensors (batches); positions
    ``0..T-2`` of each block are scored (the last has no next token). Runs in eval mode (no layer dropout)
    and restores the model's mode afterwards.
    """
    import pandas as pd

    inner = _decoder(model)
    L = len(inner.layers)
    device = next(model.parameters()).device
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

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

Here: :class:`TrainConfig` and the recipe's schedule (:func:`layer_dropout_rates`, :func:`exit_loss_weights`,
:func:`curriculum_layers`, :func:`lr_at`). The forward pass with layer dropout and the early-exit loss are in
:mod:`earlyexit.training.forward`, the training loop and its checkpoint files in :mod:`earlyexit.training.loop`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

SCALES = ("uniform", "linear", "sum")
CURRICULA = ("none", "rotational", "gradual")
SCHEDULES = ("cosine", "linear", "constant")
DEFAULT_ROTATION = 4  # R of the rotational curriculum when curriculum_param is None

# Config fields that may change between an interrupted run and its resumption without changing the math.
RESUME_FREE = ("checkpoint_every", "keep_checkpoints", "keep_weights")
EXIT_TARGETS = ("data", "distill")
# Fields added after checkpoints existed: left out of a recipe's key at these values, so old keys stay valid.
LATER_DEFAULTS = {"exit_target": "data", "amp_cpu": False}


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
    keep_weights
        Of the older checkpoints, delete only the optimizer state and keep the weights (``model.safetensors``,
        ``config.json``, ``train_meta.json``): snapshots along the run, to measure what each training budget
        bought (:func:`earlyexit.training.checkpoints.snapshots`). They cannot be resumed from.
    checkpoint_exit_head
        Recompute each layer's head + cross-entropy in the backward pass (``torch.utils.checkpoint``) rather
        than storing a ``(batch, seq, vocab)`` log-softmax per exit layer: about +1/3 head compute for a
        large memory saving. Worth it on GPU with big batches; off by default.
    amp
        Autocast to bfloat16 on CUDA (weights and optimizer stay in the model's dtype). Ignored on CPU.
    amp_cpu
        Autocast to bfloat16 on the CPU as well (where the CPU lacks BF16 instructions, :func:`native_bf16`, the
        products are emulated and a step is several times slower than in float32). Measured on a 2-core Xeon
        with AMX/AVX-512 BF16 (SmolLM2, 4 x 256, layer dropout on): a step in 0.68 of the float32 time, the loss
        within 0.024 nats of float32's over six steps, where other layer-dropout coins alone move it by up to 1.5 (``benchmarks/bench_train_amp.py``).
        Off by default: it changes the weights a recipe gives, and with them every number trained on them.
    exit_target
        What the exits below the last layer learn: ``"data"`` (the data's next token, LayerSkip's early-exit
        loss) or ``"distill"`` (self-distillation: the last layer's distribution on the same batch, detached,
        as soft targets; what a draft must match to be accepted). The last layer always learns the data.
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
    keep_weights: bool = False
    checkpoint_exit_head: bool = False
    amp: bool = True
    amp_cpu: bool = False
    train_embeddings: bool = True
    exit_target: str = "data"

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
        need(self.exit_target in EXIT_TARGETS,
             f"exit_target must be one of {', '.join(EXIT_TARGETS)}, got {self.exit_target!r}")
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
        need(isinstance(self.keep_weights, bool), f"keep_weights must be True or False, got {self.keep_weights!r}")

    def autocast(self, device_type: str) -> bool:
        """Whether a run on ``device_type`` ("cuda", "cpu", ...) autocasts to bfloat16: :attr:`amp` on CUDA,
        :attr:`amp_cpu` on the CPU, never elsewhere. The training loop and the page's precision sentence ask here."""
        return (self.amp and device_type == "cuda") or (self.amp_cpu and device_type == "cpu")

    def resolved_param(self, n_layers: int) -> int | None:
        """The curriculum parameter in use: R for rotational, k for gradual, None for none."""
        if self.curriculum == "rotational":
            return self.curriculum_param or DEFAULT_ROTATION
        if self.curriculum == "gradual":
            return self.curriculum_param or max(1, self.steps // max(1, n_layers - 1))
        return None


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


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 products in hardware (AVX-512 BF16 or AMX), where bfloat16 autocast
    pays. Elsewhere torch emulates them: on a 2-core AMD EPYC with AVX2 only (Zen 3), a training step of the embedded
    model under autocast took 12.2 times the float32 step (53.8 s against 4.4 s, 1 x 128 tokens, 2 threads,
    ``benchmarks/bench_train_amp.py``); the cpu profile's chapter 6 had not finished 10 of its 40 steps in 48 min."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)

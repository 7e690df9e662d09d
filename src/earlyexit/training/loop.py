"""The training loop of the LayerSkip recipe (or the plain baseline), resumable from its checkpoint files.

    history = train(model, blocks, TrainConfig(steps=40, ...), checkpoint_dir=path)

A checkpoint is a folder ``step_NNNNNNNN/`` that appears whole or not at all: ``model.safetensors`` +
``config.json`` (loadable by ``from_pretrained``), ``train_state.pt`` (optimizer, step, RNG states) and
``train_meta.json`` (config and history). A run that finds one resumes after its step and reproduces the
uninterrupted run.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch

from ..alloc import retain_freed_memory
from ..engine.adapter import adapter
from ..clock import now as clock_now
from ..files import atomic_dir
from ..progress import enabled as progress_enabled
from . import distributed as dist_
from .recipe import RESUME_FREE, TrainConfig, curriculum_layers, exit_loss_weights, layer_dropout_rates, lr_at

CHECKPOINT_NAME = re.compile(r"^step_(\d{8})$")


def latest_checkpoint(checkpoint_dir: os.PathLike | None) -> Path | None:
    """The newest complete checkpoint under ``checkpoint_dir`` (``step_NNNNNNNN/``), or None.

    A checkpoint directory only ever appears complete: it is written under a temporary name and moved into
    place with ``os.replace``.
    """
    if checkpoint_dir is None or not Path(checkpoint_dir).is_dir():
        return None
    found = sorted((int(m.group(1)), p) for p in Path(checkpoint_dir).iterdir()
                   if p.is_dir() and (m := CHECKPOINT_NAME.match(p.name)))
    return found[-1][1] if found else None


def _save_weights(model, directory: Path, weights: dict | None = None) -> None:
    """``model.safetensors`` + ``config.json``, loadable by ``from_pretrained``.

    Not ``save_pretrained``: it refuses models still carrying a quantizer (a GGUF loaded with
    ``gguf_file=`` keeps one although its weights are dequantized). safetensors refuses tensors that share
    storage, so tied weights (``lm_head.weight`` = ``model.embed_tokens.weight``) are written once, under
    their first name; ``from_pretrained`` and :func:`load_checkpoint_weights` tie them again.
    """
    import copy

    from safetensors.torch import save_file

    out, seen = {}, set()
    for k, v in (model.state_dict() if weights is None else weights).items():
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


def _save_checkpoint(checkpoint_dir: Path, model, weights: dict, opt_state: dict, opt_format: str,
                     gen: torch.Generator, step: int, cfg: TrainConfig, history: dict) -> Path:
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir / f"step_{step:08d}"
    with atomic_dir(final, prefix=".tmp_step_") as tmp:
        _save_weights(model, tmp, weights)
        state = {"step": step, "optimizer": opt_state, "dropout_rng": gen.get_state(),
                 "torch_rng": torch.get_rng_state()}
        if opt_format != "ddp":
            state["parallel"] = opt_format
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        torch.save(state, tmp / "train_state.pt")
        (tmp / "train_meta.json").write_text(json.dumps({"step": step, "config": asdict(cfg),
                                                         "history": history}, indent=1))
    older = sorted(p for p in checkpoint_dir.iterdir() if p.is_dir() and CHECKPOINT_NAME.match(p.name))
    stale = [p for p in checkpoint_dir.iterdir() if p.name.startswith(".tmp_step_")]  # from a killed run
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    for p in older[:-cfg.keep_checkpoints]:
        if cfg.keep_weights:                     # a snapshot: the weights stay, the optimizer state goes
            (p / "train_state.pt").unlink(missing_ok=True)
        else:
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


def _param_groups(model, cfg: TrainConfig) -> list[dict]:
    A = adapter(model)
    embed, head = A.embed_tokens.weight, A.head.weight
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
          checkpoint_dir: os.PathLike | None = None, progress: bool = True, parallel: str = "ddp") -> dict:
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

    Under ``torchrun`` the processes train together (:mod:`earlyexit.training.distributed`): ``parallel``
    ``"ddp"`` replicates the model, ``"fsdp"`` shards it (FSDP2: each decoder layer its own unit). Either way
    the steps are those of one process; rank 0 writes the checkpoints.
    """
    retain_freed_memory()   # a step allocates and frees gigabytes: keep them (earlyexit.alloc)
    if parallel not in dist_.PARALLEL:
        raise ValueError(f"parallel must be one of {', '.join(dist_.PARALLEL)}, got {parallel!r}")
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    if not callable(blocks):
        raise TypeError("blocks must be a function step -> LongTensor (batch_size, seq_len)")
    A = adapter(model)
    L, device = A.L, A.device
    w = dist_.world(device)
    start_row, stop_row = w.rows(cfg.batch_size)
    rows = None if w.size == 1 else (start_row, stop_row, cfg.batch_size)
    param = cfg.resolved_param(L)
    rates = layer_dropout_rates(L, cfg.p_max) if cfg.recipe else None
    torch.manual_seed(cfg.seed)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(cfg.seed)
    groups = _param_groups(model, cfg)          # also freezes what the recipe does not train
    history = {"step": [], "loss": [], "final_ce": [], "lr": [], "n_exits": [], "seconds": [], "layer_ce": []}
    start = 0

    ckdir = Path(checkpoint_dir) if checkpoint_dir is not None else None
    ck = latest_checkpoint(ckdir)
    state = None
    if ck is not None:
        meta = json.loads((ck / "train_meta.json").read_text())
        saved, now = meta["config"], json.loads(json.dumps(asdict(cfg)))
        diff = sorted(k for k in set(saved) | set(now) if k not in RESUME_FREE and saved.get(k) != now.get(k))
        if diff:
            raise ValueError(f"checkpoint {ck} was written with a different config ({', '.join(diff)}); "
                             f"use another checkpoint_dir or the same TrainConfig")
        state = torch.load(ck / "train_state.pt", weights_only=True, map_location="cpu")
        if state.get("parallel", "ddp") != dist_.optimizer_format(w, parallel):
            raise ValueError(f"checkpoint {ck} holds {state.get('parallel', 'ddp')} optimizer state; resume it with "
                             f"parallel={state.get('parallel', 'ddp')!r}")
        load_checkpoint_weights(model, ck)
        start = int(state["step"])
        history = meta["history"]
        history["layer_ce"] = [{int(k): v for k, v in d.items()} for d in history["layer_ce"]]

    objective = dist_.wrap(model, w, parallel, target=cfg.exit_target if cfg.recipe else "data")
    sharded = dist_.optimizer_format(w, parallel) == "fsdp"
    if sharded:
        groups = _param_groups(model, cfg)      # the sharded parameters replace the plain ones
    # fused AdamW: one kernel over all tensors; on 2 CPU cores ~6x faster than foreach for 135M params
    fused = device.type in ("cpu", "cuda") and all(p.dtype.is_floating_point for p in model.parameters()) \
        and not sharded
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=1e-8, fused=fused or None)
    if state is not None:
        dist_.load_optimizer(objective, opt, state["optimizer"], w, parallel)
        gen.set_state(state["dropout_rng"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])

    was_training = model.training
    use_amp = cfg.autocast(device.type)
    bar = None
    if progress and w.main and start < cfg.steps and progress_enabled():
        from tqdm.auto import tqdm
        bar = tqdm(total=cfg.steps, initial=start, desc="LayerSkip" if cfg.recipe else "baseline",
                   unit="step")
    try:
        model.train()
        for step in range(start, cfg.steps):
            t0 = clock_now(device)
            lr = lr_at(step, cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            ids = blocks(step)
            if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or \
                    tuple(ids.shape) != (cfg.batch_size, cfg.seq_len):
                raise ValueError(f"blocks({step}) must return a LongTensor of shape "
                                 f"({cfg.batch_size}, {cfg.seq_len}), got "
                                 f"{getattr(ids, 'dtype', type(ids))} {tuple(getattr(ids, 'shape', ()))}")
            ids = ids[start_row:stop_row].to(device)  # this process's rows (all of them in one process)
            layers = curriculum_layers(cfg.curriculum, step, L, param) if cfg.recipe else [L - 1]
            weights = exit_loss_weights(layers, L, cfg.scale, cfg.e_scale)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
                loss, per_layer = objective(ids, layers, weights, rates, gen, cfg.checkpoint_exit_head, rows)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]],
                                               cfg.grad_clip)
            opt.step()
            dt = clock_now(device) - t0
            logged = dist_.mean(w, [float(loss.detach())] + [per_layer[l] for l in layers])
            per_layer = dict(zip(layers, logged[1:]))
            history["step"].append(step)
            history["loss"].append(logged[0])
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
                weights, opt_state = dist_.full_state(objective, model, opt, w, parallel)  # every rank gathers
                if w.main:  # one writer; the others wait until the checkpoint is in place
                    _save_checkpoint(ckdir, model, weights, opt_state, dist_.optimizer_format(w, parallel), gen,
                                     done, cfg, history)
                dist_.barrier(w)
    finally:
        if bar is not None:
            bar.close()
        model.train(was_training)
    return history


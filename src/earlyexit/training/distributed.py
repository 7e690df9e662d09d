"""Training over several processes with torch.distributed (``torchrun --nproc_per_node N``).

The recipe stays the same whatever the number of processes: every rank reads the whole global batch of a step
(the data order is the one-process order), draws the layer-dropout coins for the whole batch from the same
seeded generator, and keeps its own contiguous slice of rows. :class:`Objective` wraps the early-exit loss in a
module so that :class:`~torch.nn.parallel.DistributedDataParallel` averages the gradients; the rows are split
evenly, so the average of the ranks' mean losses is the global batch's mean loss, and the optimizer steps are
those of one process (up to the order of floating-point sums). Only rank 0 writes checkpoints. With ``parallel="fsdp"`` (FSDP2) the parameters are sharded
instead of replicated; a checkpoint then gathers the full weights and optimizer state (rank 0 writes them).

Under ``torchrun`` the process group is made from the environment it sets (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``): gloo on CPUs, NCCL on GPUs. In a plain process nothing here starts a process group.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .forward import early_exit_loss


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def rows(self, batch_size: int) -> tuple[int, int]:
        """This rank's rows ``[start, stop)`` of a global batch of ``batch_size`` (an even split)."""
        if batch_size % self.size:
            raise ValueError(f"batch_size {batch_size} does not split evenly over {self.size} processes; "
                             f"use a batch size that is a multiple of {self.size}")
        n = batch_size // self.size
        return self.rank * n, (self.rank + 1) * n


def launched() -> bool:
    """True in a process started by ``torchrun`` (or any launcher that sets WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def world(device: torch.device | str | None = None) -> World:
    """The process group this process belongs to, started from torchrun's environment on first use.

    Returns ``World()`` (rank 0 of 1) in a plain process."""
    import torch.distributed as dist

    if not dist.is_available() or not (dist.is_initialized() or launched()):
        return World()
    if not dist.is_initialized():
        gpu = str(device or "cpu").split(":")[0] in ("cuda", "auto") and torch.cuda.is_available()
        backend = "nccl" if gpu else "gloo"
        dist.init_process_group(backend=backend)
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def device_for(device: str, w: World) -> str:
    """``cuda`` becomes this rank's own GPU (``cuda:<LOCAL_RANK>``) when several processes share a node."""
    if w.size > 1 and str(device) in ("cuda", "auto") and torch.cuda.is_available():
        torch.cuda.set_device(w.local_rank)
        return f"cuda:{w.local_rank}"
    return device


def barrier(w: World) -> None:
    if w.size > 1:
        import torch.distributed as dist

        dist.barrier()


def mean(w: World, values: list[float]) -> list[float]:
    """The mean over ranks of each value (for the logged losses); the values themselves in one process."""
    if w.size == 1:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return (t / w.size).tolist()


class Objective(torch.nn.Module):
    """The early-exit loss as a module, so that DDP can wrap it (the decoder is run layer by layer, not through
    ``model.forward``). ``rows`` names this rank's slice of the global batch for the layer-dropout draws."""

    def __init__(self, model, target: str = "data"):
        super().__init__()
        self.model = model
        self.target = target

    def forward(self, ids, layers, weights, drop_rates, generator, checkpoint_head, rows):
        return early_exit_loss(self.model, ids, layers, weights, drop_rates=drop_rates, generator=generator,
                               checkpoint_head=checkpoint_head, rows=rows, target=self.target)


PARALLEL = ("ddp", "fsdp")


def wrap(model, w: World, mode: str = "ddp", target: str = "data"):
    """The objective to call in the training loop: plain in one process; with several, under DDP (``"ddp"``:
    every rank holds the whole model, gradients are averaged) or FSDP2 (``"fsdp"``: parameters, gradients and
    optimizer state are sharded over the ranks, each decoder layer gathered for its own forward and backward;
    for models that do not fit one device)."""
    if mode not in PARALLEL:
        raise ValueError(f"parallel mode {mode!r} is not available; valid: {', '.join(PARALLEL)}")
    obj = Objective(model, target)
    if w.size == 1:
        return obj
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        from ..engine.adapter import adapter

        for layer in adapter(model).layers:
            fully_shard(layer)
        fully_shard(obj)          # the rest (embeddings, final norm, head) as one unit around the objective
        return obj
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = next(model.parameters()).device
    # every layer runs on every rank in every step (forward_layers with rows), so every parameter has a gradient
    return DDP(obj, device_ids=[dev.index] if dev.type == "cuda" else None)


def optimizer_format(w: World, mode: str) -> str:
    """How a checkpoint's optimizer state is laid out: "fsdp" (full state dict by parameter name) when FSDP
    sharded it, else "ddp" (``optimizer.state_dict()``, the same as one process)."""
    return "fsdp" if (mode == "fsdp" and w.size > 1) else "ddp"


def _fsdp_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state(objective, model, opt, w: World, mode: str) -> tuple[dict | None, dict]:
    """The model's weights (None: read them from ``model``) and the optimizer state to write in a checkpoint.
    Under FSDP every rank must call this (the shards are gathered); rank 0 gets the full tensors."""
    if optimizer_format(w, mode) != "fsdp":
        return None, opt.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    sd = get_model_state_dict(objective, options=_fsdp_options())
    weights = {k.removeprefix("model."): v for k, v in sd.items()}
    return weights, get_optimizer_state_dict(objective, opt, options=_fsdp_options())


def load_optimizer(objective, opt, state: dict, w: World, mode: str) -> None:
    """Load a checkpoint's optimizer state (as :func:`full_state` wrote it) into ``opt``."""
    if optimizer_format(w, mode) != "fsdp":
        opt.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(objective, opt, optim_state_dict=state, options=StateDictOptions(full_state_dict=True))

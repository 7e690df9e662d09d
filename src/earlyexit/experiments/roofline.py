"""The cost model's units on devices that are not here: a roofline, calibrated on one published time.

    dev = roofline.device("a100-80gb")
    u = roofline.units(shapes.shape("llama-2-7b"), dev, dtype="float16", batch=1)   # the costmodel's table
    budget.speedup(0.8, 32, 8, 6, u)                                                # predicted speed-up

A unit of work (a decoder layer over k tokens, the head over r rows, ...) costs the larger of its bytes over the
device's memory bandwidth and its FLOPs over its peak, plus a fixed cost per kernel it launches (the time a
framework spends starting each operation: at batch one on a GPU it is most of a small model's step). The table
has the layout of :func:`earlyexit.experiments.costmodel.measure_units`, so :func:`~earlyexit.experiments.
costmodel.predict` and :mod:`~earlyexit.experiments.budget` price any run on it as they price this machine's.

The device figures are the vendors' datasheets (:data:`DEVICES`, with sources). The per-kernel cost is not a
datasheet number: :func:`calibrate` sets it so that one published autoregressive time per token is reproduced,
and everything else is then a prediction.

Batch: a unit's size is the tokens (or rows) of one call in all; with ``batch`` sequences decoding together those
tokens are spread over the sequences, each reading its own cached K/V, while the weights are read once.
:func:`earlyexit.experiments.budget.at_batch` turns one sequence's calls into the batch's (the sequences are taken
to draft and accept in step, the usual simplification).
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass

import pandas as pd

from .costmodel import LAYER_KS

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# kernels a decoder layer launches in an eager framework: 2 norms, Q/K/V, RoPE, attention, O, gate/up, act, down,
# two residual adds (fused kernels launch fewer; the calibration absorbs the difference)
KERNELS_PER_LAYER = 11
KERNELS_HEAD = 2          # final norm + the head's product
KERNELS_STEP = 4          # embedding, argmax, cache bookkeeping, the step's host work


@dataclass(frozen=True)
class Device:
    """A device's datasheet figures: ``bandwidth_gbs`` (memory, GB/s), ``peak_tflops`` (dense 16-bit tensor
    math, TFLOP/s), and ``launch_us`` (seconds per kernel launched, in µs; see :func:`calibrate`)."""

    name: str
    bandwidth_gbs: float
    peak_tflops: float
    launch_us: float
    source: str

    def with_launch(self, launch_us: float) -> "Device":
        return dataclasses.replace(self, launch_us=float(launch_us))


DEVICES = {
    "a100-80gb": Device("NVIDIA A100 80GB SXM", 2039.0, 312.0, 5.0,
                        "NVIDIA A100 Tensor Core GPU datasheet (2021): 80GB SXM, HBM2e 2,039 GB/s, "
                        "BF16/FP16 tensor 312 TFLOPS dense"),
    "h100-sxm": Device("NVIDIA H100 SXM", 3350.0, 989.0, 5.0,
                       "NVIDIA H100 Tensor Core GPU datasheet (2023): SXM5 80 GB HBM3, 3.35 TB/s, "
                       "BF16/FP16 tensor 1,979 TFLOPS with sparsity, 989 dense"),
    "h200": Device("NVIDIA H200 SXM", 4800.0, 989.0, 5.0,
                   "NVIDIA H200 Tensor Core GPU datasheet (2024): 141 GB HBM3e, 4.8 TB/s, "
                   "BF16/FP16 tensor 1,979 TFLOPS with sparsity, 989 dense"),
}


def device(name: str) -> Device:
    """The registered device ``name``; an unknown name is refused with the registered ones."""
    if name not in DEVICES:
        close = difflib.get_close_matches(name, DEVICES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown device {name!r}{hint}; registered: {', '.join(DEVICES)}")
    return DEVICES[name]


def layer_params(shape) -> int:
    """Weights of one decoder layer: Q, K, V, O, gate, up, down, and two norms."""
    q = shape.hidden * shape.heads * shape.head_dim
    kv = 2 * shape.hidden * shape.kv_heads * shape.head_dim
    o = shape.heads * shape.head_dim * shape.hidden
    mlp = 3 * shape.hidden * shape.intermediate
    return q + kv + o + mlp + 2 * shape.hidden


def _time(nbytes: float, flops: float, kernels: int, dev: Device) -> float:
    return max(nbytes / (dev.bandwidth_gbs * 1e9), flops / (dev.peak_tflops * 1e12)) + kernels * dev.launch_us * 1e-6


def layer_seconds(shape, dev: Device, k: int, ctx: int, dtype: str = "bfloat16", batch: int = 1) -> float:
    """One decoder layer over ``k`` tokens in all, spread over ``batch`` sequences with ``ctx`` keys cached each."""
    b = BYTES[dtype]
    kv_bytes = 2 * (ctx * batch + k) * shape.kv_heads * shape.head_dim * b              # read the caches, write k
    attn = 4 * k * (ctx + k / batch) * shape.heads * shape.head_dim                    # QK^T and AV
    return _time(layer_params(shape) * b + kv_bytes, 2 * layer_params(shape) * k + attn, KERNELS_PER_LAYER, dev)


def head_seconds(shape, dev: Device, rows: int, dtype: str = "bfloat16", vocab: int | None = None) -> float:
    """The head (``vocab`` rows of the output matrix, all of them by default) over ``rows`` positions in all."""
    V = vocab or shape.vocab
    return _time(V * shape.hidden * BYTES[dtype] + rows * V * 4, 2 * rows * V * shape.hidden, KERNELS_HEAD, dev)


ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def units(shape, dev: Device, dtype: str = "bfloat16", ctx: int = 512, batch: int = 1,
          shortlist: int = 8192) -> pd.DataFrame:
    """The cost model's unit table (unit, size, seconds) for ``shape`` on ``dev``: what
    :func:`~earlyexit.experiments.costmodel.measure_units` times on this machine, priced by the roofline."""
    if dtype not in BYTES:
        raise ValueError(f"dtype must be one of {', '.join(BYTES)}, got {dtype!r}")
    rows = [{"unit": "layer", "size": k, "seconds": layer_seconds(shape, dev, k, ctx, dtype, batch)}
            for k in sorted({*LAYER_KS, *ROWS})]
    K = min(shortlist, shape.vocab)
    kvb = 2 * shape.hidden * shape.kv_heads * shape.head_dim * BYTES[dtype]
    for r in ROWS:
        rows.append({"unit": "head", "size": r, "seconds": head_seconds(shape, dev, r, dtype)})
        rows.append({"unit": "head_short", "size": r, "seconds": head_seconds(shape, dev, r, dtype, K)})
        rows.append({"unit": "decide", "size": r, "seconds": _time(r * shape.vocab * 8, 5 * r * shape.vocab, 2, dev)})
        rows.append({"unit": "kv", "size": r, "seconds": _time(kvb, kvb // BYTES[dtype] * r, 2, dev)})
    rows.append({"unit": "step", "size": 1, "seconds": KERNELS_STEP * dev.launch_us * 1e-6})
    rows.append({"unit": "shortlist", "size": K, "seconds": float("nan")})
    return pd.DataFrame(rows)


def step_seconds(shape, dev: Device, dtype: str = "bfloat16", ctx: int = 512, batch: int = 1) -> float:
    """One full-depth decoding step of ``batch`` sequences (every layer over one token each, the head over one row
    each, the step's overhead)."""
    return (shape.layers * layer_seconds(shape, dev, batch, ctx, dtype, batch) + head_seconds(shape, dev, batch, dtype)
            + KERNELS_STEP * dev.launch_us * 1e-6)


def calibrate(dev: Device, shape, ar_ms: float, dtype: str = "float16", ctx: int = 512, batch: int = 1) -> Device:
    """``dev`` with the per-kernel cost that makes a full-depth step of ``shape`` take ``ar_ms`` milliseconds (a
    published autoregressive time per token). Refuses a time below what the datasheet alone allows."""
    bare = step_seconds(shape, dev.with_launch(0.0), dtype, ctx, batch)
    kernels = shape.layers * KERNELS_PER_LAYER + KERNELS_HEAD + KERNELS_STEP
    extra = ar_ms * 1e-3 - bare
    if extra < 0:
        raise ValueError(f"{ar_ms} ms per token is below the roofline's {bare * 1e3:.2f} ms for this shape on "
                         f"{dev.name}: the datasheet figures or the published time are off")
    return dev.with_launch(extra / kernels * 1e6)

"""Weight-only low-precision paths for CPU inference: the weights in int8 or int4, the activations in float32.

Batch-1 decoding reads every weight once a token, so its speed is set by the weights' bytes. The embedded model is
stored as Q4_1 (blocks of 32 weights, each ``d * q + m`` with a 4-bit ``q`` and a half-precision scale ``d`` and
minimum ``m``: 5 bits a weight); the float32 engine reads 6.4 times those bytes. Two paths read fewer, through
kernels torch itself ships for its CPU builds:

- ``int8``: every output row scaled symmetrically, ``W ≈ s_row * q`` with ``q`` in [-127, 127]
  (``aten._weight_int8pack_mm``): 8 bits a weight plus a float a row.
- ``int4``: Q4_1's own layout, groups of 32 along the input, ``W ≈ d * q + m`` with ``q`` in [0, 15]
  (``aten._weight_int4pack_mm_for_cpu``, whose groups dequantize as ``(q - 8) * scale + zero``: scale ``d``,
  zero ``m + 8 d``). The embedded model's weights *are* such blocks (transformers dequantized them to float32),
  so :func:`int4_blocks` recovers each block's ``q``, ``d`` and ``m`` exactly and this path holds the GGUF's
  weights, not an approximation of them (tested).

:class:`LowBit` keeps the interface of :class:`~earlyexit.engine.adapter.Packed` (fused W_Q|W_K|W_V, W_O and the
MLP into the residual, the head), so the decoding loop, copy-forward and self-speculation run on it unchanged:
``decode(LowBitAdapter(lm, "int4"), prompts, cfg, n)``. float32 stays the reference of every exactness claim in the
book. (Kept apart from :mod:`~earlyexit.engine.adapter`, whose every edit re-keys the book's whole result cache.)
"""
from __future__ import annotations

import weakref

import torch

from .adapter import Adapter, Packed, _cat

WEIGHTS = ("int8", "int4")
GROUP = 32          # Q4_1's block: weights sharing one scale and minimum
# The products' inputs, scales and outputs: torch's CPU kernels for these weights are fast in bfloat16 and 10-25
# times slower with float32 inputs (measured on the reference EPYC: W_gate of SmolLM2-135M, one row, int4 59 us in
# bf16 and 1600 us in fp32; the packed fp32 product 303 us). The residual stream, norms and attention stay float32.
ACT = torch.bfloat16


def available(kind: str) -> bool:
    """Whether this torch build has the CPU kernel the path ``kind`` needs."""
    op = {"int8": "_weight_int8pack_mm", "int4": "_weight_int4pack_mm_for_cpu"}[kind]
    return hasattr(torch.ops.aten, op)


def check(A: Adapter, kind: str) -> None:
    """Raise a clear error, before any work, when the path ``kind`` cannot run for ``A``; the message names the
    path that will run instead."""
    if kind not in WEIGHTS:
        raise ValueError(f"weights {kind!r}: choose one of {', '.join(WEIGHTS)} (or a plain Adapter for the "
                         f"model's own weights)")
    where = f"{A.dtype} weights on {A.device.type}"
    if A.device.type != "cpu" or A.dtype != torch.float32:
        raise ValueError(f"the {kind} weight path is for float32 models on a CPU, not {where}: a plain "
                         f"Adapter runs the model's own {A.dtype} weights instead")
    if not available(kind):
        raise ValueError(f"this torch build ({torch.__version__}) has no CPU kernel for the {kind} weight path: "
                         f"a plain Adapter runs the packed float32 weights instead")
    if kind == "int4":
        sizes = {A.config.hidden_size, A.H * A.d, A.config.intermediate_size}
        bad = sorted(k for k in sizes if k % GROUP)
        if bad:
            raise ValueError(f"the int4 path groups {GROUP} inputs a scale; this model's input sizes {bad} are not "
                             f"multiples of {GROUP}: the int8 path (or a plain Adapter) runs instead")


def int8_rows(W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``W`` (out, in) as int8 rows and a float32 scale a row: ``W ≈ q * s[:, None]``."""
    s = (W.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(W / s[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), s.float().contiguous()


def int4_blocks(W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``W`` (out, in) as Q4_1 blocks of :data:`GROUP` inputs: ``q`` (out, in) in [0, 15], ``d`` and ``m``
    (out, in / GROUP), with ``W ≈ d * q + m`` blockwise; exact when ``W`` came from such blocks."""
    N, K = W.shape
    g = W.float().view(N, K // GROUP, GROUP)
    m = g.amin(-1)
    d = (g.amax(-1) - m) / 15
    step = torch.where(d > 0, d, torch.ones_like(d))
    q = torch.round((g - m[..., None]) / step[..., None]).clamp(0, 15).to(torch.int32)
    return q.view(N, K), d, m


def dequantize_int4(q, d, m) -> torch.Tensor:
    N, K = q.shape
    return (q.view(N, K // GROUP, GROUP).float() * d[..., None] + m[..., None]).view(N, K)


class _Product:
    """``f(x) = x W^T + b`` through a low-precision kernel (:meth:`_mm` on the rows of ``x`` in :data:`ACT`),
    returned in ``x``'s dtype."""

    def __init__(self, b):
        self.b = None if b is None else b.detach()

    def __call__(self, x):
        y = self._mm(x.reshape(-1, x.shape[-1]).to(ACT).contiguous())
        y = y.view(*x.shape[:-1], -1).to(x.dtype)
        return y if self.b is None else y + self.b


class _Int8(_Product):
    def __init__(self, W, b):
        super().__init__(b)
        q, s = int8_rows(W.detach())
        self.q, self.s = q, s.to(ACT)

    def _mm(self, x):
        return torch.ops.aten._weight_int8pack_mm(x, self.q, self.s)


class _Int4(_Product):
    def __init__(self, W, b):
        super().__init__(b)
        q, d, m = int4_blocks(W.detach())
        self.w = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        self.sz = torch.stack([d, m + 8 * d], -1).transpose(0, 1).contiguous().to(ACT)  # (in / GROUP, out, 2)

    def _mm(self, x):
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.w, GROUP, self.sz)


class LowBitAdapter(Adapter):
    """An :class:`~earlyexit.engine.adapter.Adapter` whose products read ``weights`` ("int8" or "int4") copies of
    the model's matrices (float32 model on a CPU; checked before any work, see :func:`check`)."""

    def __init__(self, lm, weights: str):
        super().__init__(lm, pack=False)
        check(self, weights)
        self.weights = weights

    def for_inference(self) -> "LowBitAdapter":
        self.packed = KINDS[self.weights].of(self)
        return self


# model -> {kind: (weight versions, LowBit)}, as adapter keeps its packed float32 copies
_HELD: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class LowBit(Packed):
    """A model's matrices at ``kind`` (int8 or int4) weights, with :class:`Packed`'s methods; built once per
    model, kind and weight version (:meth:`of`)."""

    kind = "int8"

    @classmethod
    def of(cls, A: Adapter) -> "LowBit":
        key = cls._key(A)
        per = _HELD.setdefault(A.model, {})
        held = per.get(cls.kind)
        if held is None or held[0] != key:
            per.pop(cls.kind, None)
            with torch.no_grad():
                held = (key, cls(A))
            per[cls.kind] = held
        return held[1]

    def __init__(self, A: Adapter):
        make = {"int8": _Int8, "int4": _Int4}[self.kind]
        self.nq = A.H * A.d
        self.f_qkv, self.f_kv, self.f_o, self.f_gate, self.f_up, self.f_down = ([] for _ in range(6))
        self.silu = []
        for layer in A.layers:
            at, mlp = layer.self_attn, layer.mlp
            bias = [at.q_proj.bias, at.k_proj.bias, at.v_proj.bias]
            self.f_qkv.append(make(torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight]), _cat(*bias)))
            self.f_kv.append(make(torch.cat([at.k_proj.weight, at.v_proj.weight]), _cat(*bias[1:])))
            for fs, m in ((self.f_o, at.o_proj), (self.f_gate, mlp.gate_proj), (self.f_up, mlp.up_proj),
                          (self.f_down, mlp.down_proj)):
                fs.append(make(m.weight, m.bias))
            self.silu.append(isinstance(mlp.act_fn, torch.nn.SiLU))
        # the head at int8 in both paths: the GGUF keeps it at 8 bits (Q8_0) beside its Q4_1 layers
        self.f_head = _Int8(A.head.weight, A.head.bias)

    def weight_bytes(self) -> int:
        """Bytes the products read a token: the packed weights and their scales (biases aside)."""
        fs = self.f_qkv + self.f_o + self.f_gate + self.f_up + self.f_down + [self.f_head]
        return sum(sum(t.numel() * t.element_size() for k, t in vars(f).items() if isinstance(t, torch.Tensor)
                       and k != "b") for f in fs)

    def qkv_proj(self, l, x, with_q=True):
        return self.f_qkv[l](x) if with_q else self.f_kv[l](x)

    def o_residual(self, l, o, h):
        return h + self.f_o[l](o)

    def mlp_residual(self, l, x, h, module):
        g = self.f_gate[l](x)
        g = torch.nn.functional.silu(g) if self.silu[l] else module.act_fn(g)
        return h + self.f_down[l](g * self.f_up[l](x))

    def head(self, x):
        return self.f_head(x)


class Int8(LowBit):
    kind = "int8"


class Int4(LowBit):
    kind = "int4"


KINDS = {"int8": Int8, "int4": Int4}

"""One view of a Llama-family causal LM: its pieces, and the q/k/v projection with RoPE, written once.

Whatever the caller holds (a :class:`~earlyexit.engine.models.LoadedModel`, a Hugging Face
``*ForCausalLM``, or an :class:`Adapter` already), :func:`adapter` returns the same object:

    A = adapter(lm)
    h = A.embed(ids)                          # (b, S, D)
    cos, sin = A.rope(h, positions)           # positions (b, S)
    q, k, v = A.qkv(l, h, cos, sin)           # layer l's input norm, W_Q/W_K/W_V, q/k norms, RoPE
    logits = A.logits(h)                      # final norm + shared head

The decoding loop, copy-forward, self-speculation and the training code all read the model through it.

Packed weights (CPU inference). Decoding multiplies a few rows (one token, a verification chunk, a
recompute batch) by each weight matrix, so its speed is the speed at which those matrices stream from memory.
On the reference CPU (an AMD EPYC, one thread), torch's ``linear`` (MKL) streams them at 17-20 GB/s for one
row and packs the matrix again on every call for two or more, so that 2 rows cost 1.35-2.0 times 1 row and the
LM head over 3 rows 3 times; a sum over the same bytes reads about 30-40 GB/s. The same products through oneDNN
over weights reordered once into its blocked layout (what inductor's frozen CPU graphs call) stream at 33-42 GB/s
for one row, and 2-4 rows cost 1.08-1.39 times 1 row (``benchmarks/bench_engine.py --kernels``, side by side).
:meth:`Adapter.for_inference` (called by the decoding front door and the cost model) builds those copies once
per model and weight version (:class:`Packed`), and every product without gradients uses them. They change only float rounding (tested
against Hugging Face and against the module layout); training (gradients on) never uses them.
"""
from __future__ import annotations

import weakref

import torch

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3")
FUSED_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
PACK_HINT_ROWS = 4  # the rows oneDNN lays the weights out for (1 picks a layout that is slow from 2 rows on)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def unwrap(lm) -> torch.nn.Module:
    """The Hugging Face causal LM inside ``lm`` (a LoadedModel, an Adapter, or the model itself)."""
    if isinstance(lm, Adapter):
        return lm.model
    model = getattr(lm, "model", None) if hasattr(lm, "tokenizer") else lm
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")) \
            or not hasattr(model, "lm_head"):
        raise ValueError(f"{type(model).__name__} is not a Llama-family causal LM (needs model.model."
                         f"embed_tokens / layers / norm / rotary_emb and model.lm_head); supported: "
                         f"{', '.join(SUPPORTED_ARCHS)}")
    return model


class Adapter:
    """The pieces of a Llama-family decoder, named as in the papers (see module docstring)."""

    def __init__(self, lm, pack: bool | None = None):
        model = unwrap(lm)
        inner = model.model
        cfg = model.config
        self.model, self.config = model, cfg
        self.embed_tokens, self.layers, self.norm = inner.embed_tokens, inner.layers, inner.norm
        self.head, self.rotary = model.lm_head, inner.rotary_emb
        self.L = cfg.num_hidden_layers
        self.H = cfg.num_attention_heads
        self.Hkv = getattr(cfg, "num_key_value_heads", None) or self.H
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.H
        self.vocab = cfg.vocab_size
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        # the weights' identity when the caller knows it (a LoadedModel does), for checks such as a
        # classifier trained for this very model
        self.weights_id = getattr(lm, "weights_sha256", None) if not isinstance(lm, Adapter) else lm.weights_id
        # pack: None = where it pays (a CPU with oneDNN, float32 or bfloat16); False = the modules' own layout
        if pack is None:
            pack = self.device.type == "cpu" and self.dtype in (torch.float32, torch.bfloat16) and \
                onednn_available(self.dtype)
        elif pack and not (self.device.type == "cpu" and onednn_available()):
            raise ValueError(f"packed weights need a CPU torch build with oneDNN; this model is on "
                             f"{self.device.type} (torch.backends.mkldnn.is_available() = "
                             f"{torch.backends.mkldnn.is_available()}): use pack=None or False")
        elif pack and not onednn_available(self.dtype):
            raise ValueError(f"oneDNN cannot pack {self.dtype} weights on this CPU (its bf16 path needs AVX-512 "
                             f"BW/VL/DQ or AVX-NE-CONVERT): use pack=None (the modules' own layout here) or False")
        self.pack = pack
        self.packed: Packed | None = None

    def for_inference(self) -> "Adapter":
        """Use packed weights for small products from now on (see the module docstring); returns self."""
        if self.pack:
            self.packed = Packed.of(self)
        return self

    def rms(self, norm, h: torch.Tensor) -> torch.Tensor:
        """``norm(h)``; with packing on and no gradients, the fused ``F.rms_norm`` for the families' RMSNorm
        (the same formula in float32: bit-identical on CPU, tested), one kernel instead of seven."""
        if self.packed is not None and h.dtype == torch.float32 and type(norm).__name__ in FUSED_NORMS \
                and not torch.is_grad_enabled():
            return torch.nn.functional.rms_norm(h, norm.weight.shape, norm.weight, norm.variance_epsilon)
        return norm(h)

    def _pack(self):
        """The packed weights when a product should use them: packing on and no gradients."""
        P = self.packed
        return P if P is not None and not torch.is_grad_enabled() else None

    @property
    def context_limit(self) -> int:
        """Longest sequence the model attends over (its position limit, or its sliding window)."""
        cfg = self.config
        limit = cfg.max_position_embeddings
        sw = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
        return min(limit, sw) if sw else limit

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)

    def rope(self, h: torch.Tensor, pos: torch.Tensor):
        """(cos, sin) for positions ``pos`` (b, S), in ``h``'s dtype."""
        return self.rotary(h, pos)

    def qkv(self, l: int, h: torch.Tensor, cos, sin, with_q: bool = True):
        """Layer ``l``'s q, k, v for hidden states ``h`` (b, S, D): its input norm, W_Q, W_K, W_V, the q/k
        norms where the family has them (Qwen3), and RoPE. Shapes (b, H, S, d) and (b, H_kv, S, d);
        ``q`` is None when ``with_q`` is False (copy-forward needs only K and V)."""
        layer = self.layers[l]
        attn = layer.self_attn
        b, S, _ = h.shape
        P = self._pack()
        x = self.rms(layer.input_layernorm, h)
        if P is not None and not hasattr(attn, "q_norm"):
            return P.qkv_rope(l, x, cos, sin, with_q, self.H, self.Hkv, self.d)
        if P is not None:
            k_raw, v_raw, q_raw = P.qkv(l, x, with_q)
        else:
            k_raw, v_raw = attn.k_proj(x), attn.v_proj(x)
            q_raw = attn.q_proj(x) if with_q else None
        k = k_raw.view(b, S, self.Hkv, self.d).transpose(1, 2)
        v = v_raw.view(b, S, self.Hkv, self.d).transpose(1, 2)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q = None
        if with_q:
            q = q_raw.view(b, S, self.H, self.d).transpose(1, 2)
            if hasattr(attn, "q_norm"):
                q = attn.q_norm(q)
            q = q * c + rotate_half(q) * s
        if hasattr(attn, "k_norm"):
            k = attn.k_norm(k)
        k = k * c + rotate_half(k) * s
        return q, k, v

    def attn_scale(self, l: int) -> float:
        return self.layers[l].self_attn.scaling

    def finish_layer(self, l: int, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The rest of layer ``l`` after attention: ``o`` (b, H, S, d) through W_O into the residual stream,
        then the MLP block."""
        layer = self.layers[l]
        b, _, S, _ = o.shape
        o = o.transpose(1, 2).reshape(b, S, self.H * self.d)
        P = self._pack()
        if P is not None:
            h = P.o_residual(l, o, h)
            return P.mlp_residual(l, self.rms(layer.post_attention_layernorm, h), h, layer.mlp)
        h = h + layer.self_attn.o_proj(o)
        return h + layer.mlp(self.rms(layer.post_attention_layernorm, h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``head(norm(h))``: a residual stream read through the final norm and the shared LM head."""
        P = self._pack()
        x = self.rms(self.norm, h)
        return P.head(x) if P is not None else self.head(x)

    def sub_head(self, ids: torch.Tensor):
        """A head over the rows ``ids`` of the LM head only (a shortlist draft head): ``f(h) -> (..., len(ids))``
        logits of ``norm(h)``, in the packed layout when packing is on."""
        W = self.head.weight.index_select(0, ids).contiguous()
        b = self.head.bias.index_select(0, ids) if self.head.bias is not None else None
        fast = blocked_linear(W, b) if self.packed is not None else None

        def f(h):
            x = self.rms(self.norm, h)
            if fast is not None and self._pack() is not None:
                return fast(x)
            return torch.nn.functional.linear(x, W, b)
        return f


def adapter(lm) -> Adapter:
    """``lm`` as an :class:`Adapter` (returned unchanged if it is one)."""
    return lm if isinstance(lm, Adapter) else Adapter(lm)


def onednn_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build has oneDNN's prepacked linear (its x86 and Arm CPU builds do) and this CPU can
    pack weights of ``dtype`` (bfloat16 needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT: tried once on a tiny weight)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    if dtype not in _PACKABLE:
        try:
            torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), PACK_HINT_ROWS)
            _PACKABLE[dtype] = True
        except RuntimeError:
            _PACKABLE[dtype] = False
    return _PACKABLE[dtype]


_PACKABLE: dict = {}   # dtype -> whether this CPU packs it


def _blocked(W: torch.Tensor) -> torch.Tensor:
    """``W`` (out, in) reordered once into oneDNN's blocked layout for products of a few rows."""
    return torch.ops.mkldnn._reorder_linear_weight(W.detach().contiguous(), PACK_HINT_ROWS)


def _cat(*ts):
    return None if any(t is None for t in ts) else torch.cat(ts).detach().contiguous()


# model -> (weight versions, Packed): beside the model, not on it, so that copying or pickling a model never
# meets oneDNN's opaque tensors, and a model's copies go when the model does
_PACKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class Packed:
    """One model's weights reordered for oneDNN (CPU inference; see the module docstring): per layer
    W_Q|W_K|W_V fused (``w_qkv``; and W_K|W_V alone, ``w_kv``, for copy-forward), W_O, W_gate, W_up and W_down,
    and the LM head. (The fused weights are not called ``qkv``: that is the method that uses them.)

    The products after attention and in the MLP carry their neighbours as the kernel's post-ops: W_O and
    W_down add the residual, W_gate applies SiLU and W_up multiplies by it, so a layer's MLP is three
    calls and no separate element-wise pass. Kept beside the model and rebuilt when any weight changed (their
    ``_version`` counters), so training between two decodes never leaves a stale copy in use."""

    def __init__(self, A: Adapter):
        self.w_qkv, self.b_qkv, self.w_kv, self.b_kv = [], [], [], []
        self.o, self.o_b, self.gate, self.gate_b, self.up, self.up_b, self.down, self.down_b = ([] for _ in range(8))
        self.silu = []
        self.nq = A.H * A.d
        for layer in A.layers:
            at, mlp = layer.self_attn, layer.mlp
            self.w_qkv.append(_blocked(torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight])))
            self.b_qkv.append(_cat(at.q_proj.bias, at.k_proj.bias, at.v_proj.bias))
            self.w_kv.append(_blocked(torch.cat([at.k_proj.weight, at.v_proj.weight])))
            self.b_kv.append(_cat(at.k_proj.bias, at.v_proj.bias))
            for name, m in (("o", at.o_proj), ("gate", mlp.gate_proj), ("up", mlp.up_proj), ("down", mlp.down_proj)):
                getattr(self, name).append(_blocked(m.weight))
                getattr(self, name + "_b").append(None if m.bias is None else m.bias.detach())
            self.silu.append(isinstance(mlp.act_fn, torch.nn.SiLU))
        self.head_w = _blocked(A.head.weight)
        self.head_b = None if A.head.bias is None else A.head.bias.detach()

    @staticmethod
    def _key(A: Adapter) -> tuple:
        ps = [A.head.weight]
        for layer in A.layers:
            at, mlp = layer.self_attn, layer.mlp
            for m in (at.q_proj, at.k_proj, at.v_proj, at.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                ps += [m.weight] + ([m.bias] if m.bias is not None else [])
        return tuple((p.data_ptr(), p._version) for p in ps)

    @classmethod
    def of(cls, A: Adapter) -> "Packed":
        """The model's packed weights, built now if it has none or if a weight changed since."""
        key = cls._key(A)
        held = _PACKS.get(A.model)
        if held is None or held[0] != key:
            _PACKS.pop(A.model, None)                         # let the old copy go before building the new one
            with torch.no_grad():
                held = (key, cls(A))
            _PACKS[A.model] = held
        return held[1]

    def qkv_proj(self, l: int, x: torch.Tensor, with_q: bool = True) -> torch.Tensor:
        """``x`` through W_Q|W_K|W_V (or W_K|W_V alone without ``with_q``), before any reshaping."""
        return _linear(x, self.w_qkv[l], self.b_qkv[l]) if with_q else _linear(x, self.w_kv[l], self.b_kv[l])

    def qkv(self, l: int, x: torch.Tensor, with_q: bool = True):
        """Layer ``l``'s K, V and (``with_q``) Q projections of the normed ``x``, before any reshaping."""
        y = self.qkv_proj(l, x, with_q)
        lo = self.nq if with_q else 0
        nkv = (y.shape[-1] - lo) // 2
        return y[..., lo:lo + nkv], y[..., lo + nkv:], (y[..., :lo] if with_q else None)

    def qkv_rope(self, l: int, x, cos, sin, with_q: bool, H: int, Hkv: int, d: int):
        """:meth:`qkv` with RoPE applied to Q and K in one pass (families without q/k norms); returns q, k, v
        shaped (b, H, S, d), (b, H_kv, S, d) as :meth:`Adapter.qkv` does (q None without ``with_q``)."""
        b, S, _ = x.shape
        y = self.qkv_proj(l, x, with_q)
        heads = (H if with_q else 0) + Hkv
        r = y[..., :heads * d].view(b, S, heads, d)
        c, s = cos.unsqueeze(2), sin.unsqueeze(2)
        r = r * c + rotate_half(r) * s
        v = y[..., heads * d:].view(b, S, Hkv, d).transpose(1, 2)
        k = r[:, :, heads - Hkv:].transpose(1, 2)
        q = r[:, :, :H].transpose(1, 2) if with_q else None
        return q, k, v

    def o_residual(self, l: int, o: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``h + W_O o``: the attention output into the residual stream, in one call."""
        return _LINEAR.binary(o, h, self.o[l], self.o_b[l], "add")

    def mlp_residual(self, l: int, x: torch.Tensor, h: torch.Tensor, module) -> torch.Tensor:
        """``h + W_down(act(W_gate x) * W_up x)``: layer ``l``'s MLP on the normed ``x`` and the residual."""
        if self.silu[l]:
            g = _linear(x, self.gate[l], self.gate_b[l], "swish")
        else:
            g = module.act_fn(_linear(x, self.gate[l], self.gate_b[l]))
        m = _LINEAR.binary(x, g, self.up[l], self.up_b[l], "mul")
        return _LINEAR.binary(m, h, self.down[l], self.down_b[l], "add")

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(x, self.head_w, self.head_b)


def blocked_linear(W: torch.Tensor, b: torch.Tensor | None = None):
    """``f(x) = x W^T + b`` with ``W`` reordered once for oneDNN (a shortlist head's rows, say)."""
    Wb = _blocked(W)
    b = None if b is None else b.detach()
    return lambda x: _linear(x.contiguous(), Wb, b)


_LINEAR = torch.ops.mkldnn._linear_pointwise if onednn_available() else None


def _linear(x: torch.Tensor, Wb: torch.Tensor, b: torch.Tensor | None, post: str = "none") -> torch.Tensor:
    """``post(x Wb^T + b)`` for a weight reordered by :func:`_blocked`; ``post``: oneDNN's unary post-op."""
    return _LINEAR(x, Wb, b, post, [], "")

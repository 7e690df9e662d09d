"""One view of a Llama-family causal LM: its pieces, and the q/k/v projection with RoPE, written once.

Whatever the caller holds (a :class:`~earlyexit.engine.models.LoadedModel`, a Hugging Face
``*ForCausalLM``, or an :class:`Adapter` already), :func:`adapter` returns the same object:

    A = adapter(lm)
    h = A.embed(ids)                          # (b, S, D)
    cos, sin = A.rope(h, positions)           # positions (b, S)
    q, k, v = A.qkv(l, h, cos, sin)           # layer l's input norm, W_Q/W_K/W_V, q/k norms, RoPE
    logits = A.logits(h)                      # final norm + shared head

The decoding loop, copy-forward, self-speculation and the training code all read the model through it.

Packed weights (CPU, float32, inference only). Batch-1 decoding multiplies one row by each weight matrix. On
the reference CPU, torch's ``linear`` over Hugging Face's (out, in) layout streams those matrices at about
9 GB/s, while the same product over an (in, out) copy, with W_Q|W_K|W_V and W_gate|W_up each fused into one
matrix, streams at about 15 GB/s (the LM head: 12 ms against 7 ms a row); from 4 rows on the module layout
is as fast or faster. :meth:`Adapter.for_inference` (called by the decoding front door and the cost model)
builds those copies once per model and weight version, and products of at most ``PACK_MAX_ROWS`` rows use
them. They change only float rounding (tested against Hugging Face and against the module layout); training
(gradients on) never uses them.
"""
from __future__ import annotations

import torch

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3")
FUSED_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
PACK_MAX_ROWS = 3   # rows up to which the packed layout is faster (measured: 1-3 rows 1.6-1.9x, 4 rows slower)


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
        # pack: None = where it pays (CPU, float32); False = always the modules' own layout
        self.pack = (self.device.type == "cpu" and self.dtype == torch.float32) if pack is None else pack
        self.packed: Packed | None = None

    def for_inference(self) -> "Adapter":
        """Use packed weights for small products from now on (see the module docstring); returns self."""
        if self.pack:
            self.packed = Packed.of(self)
        return self

    def rms(self, norm, h: torch.Tensor) -> torch.Tensor:
        """``norm(h)``; with packing on and no gradients, the fused ``F.rms_norm`` for the families' RMSNorm
        (the same formula in float32: bit-identical on CPU, tested), one kernel instead of seven."""
        if self.packed is not None and type(norm).__name__ in FUSED_NORMS and not torch.is_grad_enabled():
            return torch.nn.functional.rms_norm(h, norm.weight.shape, norm.weight, norm.variance_epsilon)
        return norm(h)

    def _pack(self, rows: int):
        """The packed weights when this product should use them: packing on, few rows, no gradients."""
        P = self.packed
        return P if P is not None and rows <= PACK_MAX_ROWS and not torch.is_grad_enabled() else None

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
        P = self._pack(b * S)
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
        h = h + layer.self_attn.o_proj(o.transpose(1, 2).reshape(b, S, self.H * self.d))
        x = self.rms(layer.post_attention_layernorm, h)
        P = self._pack(b * S)
        return h + (P.mlp(l, x, layer.mlp) if P is not None else layer.mlp(x))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``head(norm(h))``: a residual stream read through the final norm and the shared LM head."""
        P = self._pack(h.shape[0] * (h.shape[1] if h.dim() == 3 else 1))
        x = self.rms(self.norm, h)
        return P.head(x) if P is not None else self.head(x)

    def sub_head(self, ids: torch.Tensor):
        """A head over the rows ``ids`` of the LM head only (a shortlist draft head): ``f(h) -> (..., len(ids))``
        logits of ``norm(h)``, in the packed layout when packing is on."""
        W = self.head.weight.index_select(0, ids).contiguous()
        b = self.head.bias.index_select(0, ids) if self.head.bias is not None else None
        WT = W.t().contiguous() if self.packed is not None else None

        def f(h):
            x = self.rms(self.norm, h)
            if WT is not None and self._pack(h.shape[0] * (h.shape[1] if h.dim() == 3 else 1)) is not None:
                return x @ WT if b is None else torch.addmm(b, x.reshape(-1, x.shape[-1]), WT).view(
                    *x.shape[:-1], -1)
            return torch.nn.functional.linear(x, W, b)
        return f


def adapter(lm) -> Adapter:
    """``lm`` as an :class:`Adapter` (returned unchanged if it is one)."""
    return lm if isinstance(lm, Adapter) else Adapter(lm)


def _mm(x: torch.Tensor, WT: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x @ WT
    return y if b is None else y + b


def _cat(*ts):
    return None if any(t is None for t in ts) else torch.cat(ts).contiguous()


class Packed:
    """(in, out) copies of one model's weights for small products on the CPU: per layer W_Q|W_K|W_V and
    W_gate|W_up fused, and the LM head. Kept on the model and rebuilt when any of those weights changed
    (their ``_version`` counters), so training between two decodes never leaves a stale copy in use."""

    def __init__(self, A: Adapter):
        self.qkvT, self.qkv_b, self.guT, self.gu_b = [], [], [], []
        self.nq = A.H * A.d
        self.nkv = A.Hkv * A.d
        for layer in A.layers:
            at, mlp = layer.self_attn, layer.mlp
            ps = (at.q_proj, at.k_proj, at.v_proj)
            self.qkvT.append(torch.cat([p.weight for p in ps]).t().contiguous())
            self.qkv_b.append(_cat(*(p.bias for p in ps)))
            self.guT.append(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t().contiguous())
            self.gu_b.append(_cat(mlp.gate_proj.bias, mlp.up_proj.bias))
        self.inter = mlp.gate_proj.out_features
        self.headT = A.head.weight.t().contiguous()
        self.head_b = A.head.bias

    @staticmethod
    def _key(A: Adapter) -> tuple:
        ps = [A.head.weight]
        for layer in A.layers:
            at, mlp = layer.self_attn, layer.mlp
            ps += [at.q_proj.weight, at.k_proj.weight, at.v_proj.weight, mlp.gate_proj.weight, mlp.up_proj.weight]
            ps += [m.bias for m in (at.q_proj, at.k_proj, at.v_proj, mlp.gate_proj, mlp.up_proj)
                   if m.bias is not None]
        return tuple((p.data_ptr(), p._version) for p in ps)

    @classmethod
    def of(cls, A: Adapter) -> "Packed":
        """The model's packed weights, built now if it has none or if a weight changed since."""
        key = cls._key(A)
        held = getattr(A.model, "_earlyexit_packed", None)
        if held is None or held[0] != key:
            with torch.no_grad():
                held = (key, cls(A))
            A.model._earlyexit_packed = held
        return held[1]

    def qkv(self, l: int, x: torch.Tensor, with_q: bool = True):
        """Layer ``l``'s K, V and (``with_q``) Q projections of the normed ``x``, before any reshaping."""
        nq, nkv = self.nq, self.nkv
        if with_q:
            y = _mm(x, self.qkvT[l], self.qkv_b[l])
            return y[..., nq:nq + nkv], y[..., nq + nkv:], y[..., :nq]
        b = self.qkv_b[l]
        y = _mm(x, self.qkvT[l][:, nq:], b[nq:] if b is not None else None)
        return y[..., :nkv], y[..., nkv:], None

    def qkv_rope(self, l: int, x, cos, sin, with_q: bool, H: int, Hkv: int, d: int):
        """:meth:`qkv` with RoPE applied to Q and K in one pass (families without q/k norms); returns q, k, v
        shaped (b, H, S, d), (b, H_kv, S, d) as :meth:`Adapter.qkv` does (q None without ``with_q``)."""
        b, S, _ = x.shape
        nq, nkv = self.nq, self.nkv
        lo = 0 if with_q else nq
        bias = self.qkv_b[l]
        y = _mm(x, self.qkvT[l][:, lo:], bias[lo:] if bias is not None else None)
        heads = (H if with_q else 0) + Hkv
        r = y[..., :heads * d].view(b, S, heads, d)
        c, s = cos.unsqueeze(2), sin.unsqueeze(2)
        r = r * c + rotate_half(r) * s
        v = y[..., heads * d:].view(b, S, Hkv, d).transpose(1, 2)
        k = r[:, :, heads - Hkv:].transpose(1, 2)
        q = r[:, :, :H].transpose(1, 2) if with_q else None
        return q, k, v

    def mlp(self, l: int, x: torch.Tensor, module) -> torch.Tensor:
        """Layer ``l``'s MLP on the normed ``x``: down(act(gate x) * up x), with gate|up as one product."""
        gu = _mm(x, self.guT[l], self.gu_b[l])
        return module.down_proj(module.act_fn(gu[..., :self.inter]) * gu[..., self.inter:])

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return _mm(x, self.headT, self.head_b)

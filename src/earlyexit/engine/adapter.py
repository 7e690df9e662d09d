"""One view of a Llama-family causal LM: its pieces, and the q/k/v projection with RoPE, written once.

Whatever the caller holds (a :class:`~earlyexit.engine.models.LoadedModel`, a Hugging Face
``*ForCausalLM``, or an :class:`Adapter` already), :func:`adapter` returns the same object:

    A = adapter(lm)
    h = A.embed(ids)                          # (b, S, D)
    cos, sin = A.rope(h, positions)           # positions (b, S)
    q, k, v = A.qkv(l, h, cos, sin)           # layer l's input norm, W_Q/W_K/W_V, q/k norms, RoPE
    logits = A.logits(h)                      # final norm + shared head

The decoding loop, copy-forward, self-speculation and the training code all read the model through it.
"""
from __future__ import annotations

import torch

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3")


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

    def __init__(self, lm):
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
        x = layer.input_layernorm(h)
        k = attn.k_proj(x).view(b, S, self.Hkv, self.d).transpose(1, 2)
        v = attn.v_proj(x).view(b, S, self.Hkv, self.d).transpose(1, 2)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q = None
        if with_q:
            q = attn.q_proj(x).view(b, S, self.H, self.d).transpose(1, 2)
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
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``head(norm(h))``: a residual stream read through the final norm and the shared LM head."""
        return self.head(self.norm(h))


def adapter(lm) -> Adapter:
    """``lm`` as an :class:`Adapter` (returned unchanged if it is one)."""
    return lm if isinstance(lm, Adapter) else Adapter(lm)

"""Published Llama-family model shapes, as data, and random-weight models of those shapes.

Every number below was read from ``config.json`` files on the Hugging Face hub whose ``_name_or_path`` is the id in
``source`` (copies made by fine-tunes and quantisations, several agreeing ones each: the originals, some gated, were
not reachable from here), and for SmolLM2-135M also from the GGUF the book embeds (:mod:`earlyexit.engine.models`;
``tests/test_shapes.py`` checks it). ``published`` is the size its publisher states, ``published_source`` where.

    shape("Llama-2-7B").params()                  # 6738415616
    random_model("SmolLM2-360M", layers=2)        # full width, 2 of its 32 layers, nothing downloaded

Parameter counts assume the Llama layout the configs say: no biases, SwiGLU MLP (gate, up, down), two RMSNorms
per layer plus a final one, and a head that is either its own ``vocab x hidden`` matrix or the embedding itself.
"""
from __future__ import annotations

import difflib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Shape:
    """One decoder-only Llama-family architecture.

    ``layers``        decoder layers (``num_hidden_layers``)
    ``hidden``        width of the residual stream (``hidden_size``)
    ``intermediate``  width of the SwiGLU MLP (``intermediate_size``)
    ``heads``         query heads (``num_attention_heads``)
    ``kv_heads``      key/value heads (``num_key_value_heads``; fewer than ``heads`` = grouped-query attention)
    ``vocab``         vocabulary size: rows of the embedding and of the output head
    ``tied_head``     the output head is the embedding matrix (``tie_word_embeddings``)
    ``rope_theta``    RoPE base; ``rope_scaling`` its extension, as (key, value) pairs, empty if none
    ``context``       ``max_position_embeddings``
    ``head_dim``      width of one head: ``hidden // heads`` unless the config says otherwise (0 = derive it)
    ``published``     the parameter count its publisher states; ``published_source`` says where
    ``source``        where the numbers were read
    """

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied_head: bool
    rope_theta: float
    context: int
    published: float
    published_source: str
    source: str
    rope_scaling: tuple = ()
    head_dim: int = 0

    def __post_init__(self):
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    def layer_params(self) -> int:
        """Weights of one decoder layer: q, k, v, o projections, gate/up/down, two RMSNorm scales."""
        q = o = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        return q + kv + o + 3 * self.hidden * self.intermediate + 2 * self.hidden

    def head_params(self) -> int:
        """Weights the output head multiplies by (``vocab x hidden``), whether or not they are the embedding."""
        return self.vocab * self.hidden

    def params(self, layers: int | None = None) -> int:
        """Parameter count, embedding and head counted once when tied; ``layers`` overrides the depth."""
        n = self.layers if layers is None else layers
        head = 0 if self.tied_head else self.head_params()
        return n * self.layer_params() + self.vocab * self.hidden + self.hidden + head

    def bytes(self, dtype: str = "bfloat16", layers: int | None = None) -> int:
        """Bytes of the weights in ``dtype`` ("float32", "bfloat16" or "float16")."""
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}")
        return self.params(layers) * DTYPE_BYTES[dtype]

    def head_to_layer(self) -> float:
        """The head's weights over one decoder layer's: what one head evaluation reads, in layers."""
        return self.head_params() / self.layer_params()

    def config(self, **overrides) -> dict:
        """Keyword arguments of ``transformers.LlamaConfig`` for this shape (no download), ``overrides`` applied."""
        kw = dict(num_hidden_layers=self.layers, hidden_size=self.hidden,
                  intermediate_size=self.intermediate, num_attention_heads=self.heads,
                  num_key_value_heads=self.kv_heads, head_dim=self.head_dim, vocab_size=self.vocab,
                  tie_word_embeddings=self.tied_head, rope_theta=self.rope_theta,
                  max_position_embeddings=self.context, rms_norm_eps=1e-5, hidden_act="silu",
                  attention_bias=False, mlp_bias=False, initializer_range=0.02)
        if self.rope_scaling:
            kw["rope_scaling"] = dict(self.rope_scaling)
        kw.update(overrides)
        return kw


_LLAMA3_ROPE = (("rope_type", "llama3"), ("factor", 32.0), ("low_freq_factor", 1.0), ("high_freq_factor", 4.0),
                ("original_max_position_embeddings", 8192))
_COPY = "config.json of {} (read from hub copies whose _name_or_path is that id)"

SHAPES: dict[str, Shape] = {s.name: s for s in [
    Shape("SmolLM2-135M", 30, 576, 1536, 9, 3, 49152, True, 100000.0, 8192, 135e6,
          "GGUF general.size_label of the embedded SmolLM2-135M-Instruct: 135M",
          _COPY.format("HuggingFaceTB/SmolLM2-135M") + "; same numbers in the embedded GGUF"),
    Shape("SmolLM2-360M", 32, 960, 2560, 15, 5, 49152, True, 100000.0, 8192, 360e6,
          "model name: 360M", _COPY.format("HuggingFaceTB/SmolLM2-360M")),
    Shape("SmolLM2-1.7B", 24, 2048, 8192, 32, 32, 49152, True, 130000.0, 8192, 1.7e9,
          "model name: 1.7B", _COPY.format("HuggingFaceTB/SmolLM2-1.7B")),
    Shape("TinyLlama-1.1B", 22, 2048, 5632, 32, 4, 32000, False, 10000.0, 2048, 1.1e9,
          "model name: 1.1B", _COPY.format("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T")),
    Shape("Llama-3.2-1B", 16, 2048, 8192, 32, 8, 128256, True, 500000.0, 131072, 1.23e9,
          "Meta's Llama 3.2 model card: '1B (1.23B)'", _COPY.format("meta-llama/Llama-3.2-1B"),
          rope_scaling=_LLAMA3_ROPE),
    Shape("Llama-2-7B", 32, 4096, 11008, 32, 32, 32000, False, 10000.0, 4096, 7e9,
          "model name: 7B", _COPY.format("meta-llama/Llama-2-7b-hf")),
    Shape("Llama-3-8B", 32, 4096, 14336, 32, 8, 128256, False, 500000.0, 8192, 8e9,
          "model name: 8B", _COPY.format("meta-llama/Meta-Llama-3-8B")),
    Shape("Llama-2-13B", 40, 5120, 13824, 40, 40, 32000, False, 10000.0, 4096, 13e9,
          "model name: 13B", _COPY.format("meta-llama/Llama-2-13b-hf")),
    Shape("Llama-2-70B", 80, 8192, 28672, 64, 8, 32000, False, 10000.0, 4096, 70e9,
          "model name: 70B", _COPY.format("meta-llama/Llama-2-70b-hf")),
]}


def shape(name: str) -> Shape:
    """The registered shape ``name``; an unknown name is refused with the list and the closest match."""
    if name in SHAPES:
        return SHAPES[name]
    folded = {k.lower(): k for k in SHAPES}
    if name.lower() in folded:
        return SHAPES[folded[name.lower()]]
    close = difflib.get_close_matches(name.lower(), list(folded), n=1, cutoff=0.5)
    hint = f" Did you mean {folded[close[0]]!r}?" if close else ""
    raise ValueError(f"unknown model shape {name!r}; registered: {', '.join(SHAPES)}.{hint}")


def random_model(name: str, dtype: str = "float32", layers: int | None = None, seed: int = 0, std: float = 0.02):
    """A ``LlamaForCausalLM`` of shape ``name`` with seeded random weights, built locally (never downloads).

    ``layers`` builds only that many decoder layers, at full width, for shapes that do not fit in memory: the
    caller prices the rest from :meth:`Shape.layer_params`. Construction skips initialisation (``transformers``'
    ``no_init_weights``), ties the head when the shape ties it, then fills every matrix with N(0, ``std``) (Hugging
    Face's Llama init: ``initializer_range`` 0.02), each tensor from its own ``torch.Generator`` seeded from
    ``seed`` (so threads can share the work and the weights do not depend on their number), and sets every
    RMSNorm scale to 1. Peak memory is the weights, ``shape(name).bytes(dtype, layers)``, plus the interpreter
    (about 0.4 GB with torch and transformers loaded): no second copy is made. Measured on the book's 2-core
    machine: SmolLM2-135M in 2-3 s (Hugging Face's own init of it: 12 s), Llama-3.2-1B in about 30-40 s in
    float32 (peak RSS 5.2 GB) and bfloat16 (2.8 GB); the normal draws are nearly all of it.
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers < 5
        from transformers.modeling_utils import no_init_weights

    s = shape(name)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}")
    if layers is not None and not 1 <= layers <= s.layers:
        raise ValueError(f"layers must be between 1 and {s.layers} for {s.name}, got {layers}")
    cfg = LlamaConfig(**s.config(**({} if layers is None else {"num_hidden_layers": layers})))
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    if s.tied_head:
        model.tie_weights()
    params = list(model.parameters())  # each tensor once: a tied head is the embedding
    seeds = torch.randint(2**62, (len(params),), generator=torch.Generator().manual_seed(seed)).tolist()

    def fill(i: int) -> None:  # one generator per tensor: the same weights whatever the thread count
        with torch.no_grad():
            if params[i].ndim >= 2:
                params[i].normal_(0.0, std, generator=torch.Generator().manual_seed(seeds[i]))
            else:
                params[i].fill_(1.0)

    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        list(pool.map(fill, range(len(params))))
    return model.eval()

"""The decoding engine: what early exit does to a decoder and its KV cache.

    from earlyexit.engine import DecodeConfig, decode, load_model
    lm = load_model("smollm2-135m")
    r = decode(lm, prompts, DecodeConfig.early_exit("softmax", "lazy-recompute", threshold=0.9), 32)

Modules, bottom up: ``models`` (loading: the embedded model, small test models, any HF id or path),
``adapter`` (one view of a Llama-family model), ``cache`` (the KV cache and its provenance map), ``rules``
(exit rules), ``fill`` (what happens above an exit), ``loop`` (the layer-by-layer token loop),
``speculative`` (LayerSkip self-speculation and transformers' peer), ``peers`` (economize), ``config`` (one
configuration class per method, each with the call that runs it), ``result`` (Result) and ``decode`` (the front
door).
"""
from .cache import COMPUTED, COPIED, HOLE, PAD, RECOMPUTED, STATE_NAMES
from .config import DecodeConfig
from .result import COUNTERS, Result
from .decode import decode, full_depth
from .models import LoadedModel, load_model

__all__ = ["COUNTERS", "DecodeConfig", "Result", "decode", "full_depth", "LoadedModel", "load_model",
           "COMPUTED", "COPIED", "HOLE", "PAD", "RECOMPUTED", "STATE_NAMES"]

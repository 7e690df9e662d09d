"""Trained checkpoints for the LayerSkip chapters: keyed by a hash of everything that determines them,
reused when present, built (and resumed after an interruption) when not.

    r = trained.Recipe(base="smollm2-135m", cfg=TrainConfig(steps=40, ...))
    run = trained.ensure(r)          # trains if missing; returns the final checkpoint and its history
    lm = trained.load(r)             # a LoadedModel carrying the trained weights

``base`` is a model spec of :func:`earlyexit.model.load_model` (continual pre-training of its weights) or
``"scratch:<name>"`` for a model of one of the :data:`SCRATCH` configs built with Hugging Face's own
initialisation and trained from nothing. Checkpoints live under ``data/checkpoints/<label>-<key>/``, where
``key`` hashes the base model's weights (or the scratch config), the TrainConfig, the training data (seed,
split and this Python's standard library version, which is the corpus) and the batch layout.
``python -m earlyexit train --profile cpu`` builds every checkpoint a profile's chapters use.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .. import corpus as data_mod
from .. import paths
from ..files import canonical
from .loop import _RESUME_FREE, TrainConfig, latest_checkpoint, load_checkpoint_weights, train

CHECKPOINTS = paths.DATA / "checkpoints"
FORMAT = 1  # bump when the meaning of a checkpoint's key changes

# From-scratch models: Llama-family, the embedded tokenizer's vocabulary (tied embeddings), small enough to
# train for a few hundred steps on two CPU cores.
SCRATCH = {
    "llama-8x64": dict(model_type="llama", num_hidden_layers=8, hidden_size=64, intermediate_size=192,
                       num_attention_heads=4, num_key_value_heads=2),
    "llama-8x128": dict(model_type="llama", num_hidden_layers=8, hidden_size=128, intermediate_size=384,
                        num_attention_heads=4, num_key_value_heads=2),
    "llama-4x64": dict(model_type="llama", num_hidden_layers=4, hidden_size=64, intermediate_size=128,
                       num_attention_heads=4, num_key_value_heads=2),
}


@dataclass(frozen=True)
class Recipe:
    """What a checkpoint is: a base model, a training configuration, and the data seed."""

    base: str
    cfg: TrainConfig
    data_seed: int = 0

    def __post_init__(self):
        if not isinstance(self.cfg, TrainConfig):
            raise TypeError(f"cfg must be a TrainConfig, got {type(self.cfg).__name__}")
        if self.scratch and self.scratch_name not in SCRATCH:
            raise ValueError(f"unknown scratch config {self.scratch_name!r}; valid: "
                             + ", ".join(f"scratch:{k}" for k in SCRATCH))

    @property
    def scratch(self) -> bool:
        return self.base.startswith("scratch:")

    @property
    def scratch_name(self) -> str:
        return self.base.split(":", 1)[1] if self.scratch else ""

    def label(self) -> str:
        stem = self.base.replace("scratch:", "scratch-").replace("/", "_")
        return f"{stem}-{'layerskip' if self.cfg.recipe else 'baseline'}"

    def key(self) -> str:
        train = {k: v for k, v in asdict(self.cfg).items() if k not in _RESUME_FREE}
        if self.scratch:
            base = {"scratch": SCRATCH[self.scratch_name], "init_seed": self.cfg.seed}
        else:
            base = {"spec": self.base, "weights_sha256": _base_weights_id(self.base)}
        blob = canonical({"format": FORMAT, "base": base, "train": train,
                          "data": {"seed": self.data_seed, "split": "train",
                                   "stdlib": data_mod.python_version()}})
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def directory(self, root: Path | None = None) -> Path:
        return Path(root or CHECKPOINTS) / f"{self.label()}-{self.key()}"


def _base_weights_id(spec: str) -> str:
    from ..engine.models import EMBEDDED, GGUF_SHA256, TINY

    if spec == EMBEDDED:
        return GGUF_SHA256
    if spec in TINY:
        return f"{spec}:seed0"
    p = Path(spec).expanduser()
    if p.exists():
        from ..engine.models import sha256_file

        files = sorted(p.glob("*.safetensors"))
        return ",".join(sha256_file(f) for f in files) or str(p.resolve())
    return spec  # a hub id: its revision is what the local cache holds


def scratch_model(name: str, seed: int = 0) -> torch.nn.Module:
    """A freshly initialised model of ``SCRATCH[name]`` (Hugging Face's own init, seeded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if name not in SCRATCH:
        raise ValueError(f"unknown scratch config {name!r}; valid: {', '.join(SCRATCH)}")
    kw = dict(SCRATCH[name])
    model_type = kw.pop("model_type")
    cfg = AutoConfig.for_model(model_type, vocab_size=49152, max_position_embeddings=2048,
                               tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2, **kw)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model


def _base_loaded(recipe: Recipe, device: str = "cpu"):
    """The LoadedModel training starts from (for a scratch recipe: the fresh init)."""
    from ..engine.models import LoadedModel, _load_embedded_tokenizer, _resolve_device, load_model

    device = _resolve_device(device)
    if not recipe.scratch:
        return load_model(recipe.base, device=device, dtype=torch.float32)
    model = scratch_model(recipe.scratch_name, recipe.cfg.seed).to(device=device, dtype=torch.float32)
    digest = hashlib.sha256(canonical(SCRATCH[recipe.scratch_name]).encode() +
                            str(recipe.cfg.seed).encode()).hexdigest()
    return LoadedModel(recipe.base, model.eval(), _load_embedded_tokenizer(), digest,
                       f"scratch init ({recipe.scratch_name}), seed {recipe.cfg.seed}",
                       {"seed": recipe.cfg.seed})


class Batches:
    """``blocks(step)`` for :func:`earlyexit.train.train`: deterministic batches of the training stream.

    Step ``s`` gets blocks ``s·B .. s·B + B - 1`` of :func:`earlyexit.data.token_stream` (training split,
    repeated over epochs), whatever order the steps are asked in, so a resumed run sees the same data.
    """

    def __init__(self, tokenizer, batch_size: int, seq_len: int, seed: int = 0):
        self.batch_size, self.seq_len = batch_size, seq_len
        self._it = data_mod.token_stream(tokenizer, seq_len, seed, split="train", epochs=None)
        self._blocks: list[torch.Tensor] = []

    def __call__(self, step: int) -> torch.Tensor:
        need = (step + 1) * self.batch_size
        while len(self._blocks) < need:
            self._blocks.append(next(self._it))
        return torch.stack(self._blocks[step * self.batch_size:need])


def heldout_blocks(tokenizer, n: int, seq_len: int, batch_size: int = 4) -> list[torch.Tensor]:
    """The first ``n`` blocks of the held-out (evaluation) split, in batches, for perplexity/agreement."""
    it = data_mod.token_stream(tokenizer, seq_len, 0, split="eval", epochs=1)
    blocks = []
    for _ in range(n):
        try:
            blocks.append(next(it))
        except StopIteration:
            break
    if not blocks:
        raise ValueError("the held-out split gave no blocks")
    return [torch.stack(blocks[i:i + batch_size]) for i in range(0, len(blocks), batch_size)]


@dataclass
class Run:
    recipe: Recipe
    checkpoint: Path
    history: dict
    trained_now: bool  # False when the checkpoint was already there

    @property
    def seconds(self) -> float:
        return float(sum(self.history["seconds"]))


def is_complete(recipe: Recipe, root: Path | None = None) -> bool:
    ck = latest_checkpoint(recipe.directory(root))
    return ck is not None and int(json.loads((ck / "train_meta.json").read_text())["step"]) >= recipe.cfg.steps


def ensure(recipe: Recipe, device: str = "cpu", progress: bool = True, root: Path | None = None) -> Run:
    """The finished checkpoint of ``recipe``: reused if complete, else trained (resuming a partial run)."""
    d = recipe.directory(root)
    if is_complete(recipe, root):
        ck = latest_checkpoint(d)
        meta = json.loads((ck / "train_meta.json").read_text())
        return Run(recipe, ck, meta["history"], False)
    lm = _base_loaded(recipe, device)
    batches = Batches(lm.tokenizer, recipe.cfg.batch_size, recipe.cfg.seq_len, recipe.data_seed)
    d.mkdir(parents=True, exist_ok=True)
    (d / "recipe.json").write_text(json.dumps({"base": recipe.base, "data_seed": recipe.data_seed,
                                               "config": asdict(recipe.cfg), "key": recipe.key()}, indent=1))
    history = train(lm.model, batches, recipe.cfg, checkpoint_dir=d, progress=progress)
    return Run(recipe, latest_checkpoint(d), history, True)


def load(recipe: Recipe, device: str = "auto", dtype=None, root: Path | None = None, train_if_missing: bool = True,
         progress: bool = True):
    """A LoadedModel with the weights of ``recipe``'s finished checkpoint (trained first if missing and
    ``train_if_missing``), on ``device`` in ``dtype`` (default as :func:`earlyexit.model.load_model`)."""
    from ..engine.models import LoadedModel, _resolve_device, _resolve_dtype, sha256_file

    if not is_complete(recipe, root):
        if not train_if_missing:
            raise FileNotFoundError(f"no finished checkpoint for {recipe.label()} under {recipe.directory(root)}; "
                                    f"build it with `python -m earlyexit train --profile <profile>`")
        ensure(recipe, device=device, progress=progress, root=root)
    ck = latest_checkpoint(recipe.directory(root))
    base = _base_loaded(recipe, "cpu")
    load_checkpoint_weights(base.model, ck)
    dev = _resolve_device(device)
    dt = _resolve_dtype(dtype, dev)
    model = base.model.to(device=dev, dtype=dt).eval()
    rel = ck.relative_to(paths.REPO_ROOT) if ck.is_relative_to(paths.REPO_ROOT) else ck
    return LoadedModel(f"{recipe.base}+{recipe.label().rsplit('-', 1)[-1]}@{recipe.key()}", model, base.tokenizer,
                       sha256_file(ck / "model.safetensors"), f"trained checkpoint {rel}",
                       {"base": recipe.base, "train_key": recipe.key(), "data_seed": recipe.data_seed,
                        "train_config": asdict(recipe.cfg)})


def recipes(p) -> dict[str, Recipe]:
    """The three checkpoints chapter 6 trains, from its parameters ``p`` (a Params or a dict):
    ``"layerskip"`` (continual pre-training of ``p["model"]`` with the recipe) and the from-scratch pair
    ``"scratch-baseline"`` / ``"scratch-layerskip"`` (same data, steps and seed; recipe off / on)."""
    g = p.__getitem__
    cont = TrainConfig(steps=g("steps"), batch_size=g("batch_size"), seq_len=g("seq_len"), lr=g("lr"),
                       warmup=g("warmup"), p_max=g("p_max"), e_scale=g("e_scale"), scale=g("scale"),
                       curriculum=g("curriculum"), curriculum_param=g("curriculum_param"), seed=g("seed"),
                       train_embeddings=g("train_embeddings"), checkpoint_every=g("checkpoint_every"),
                       keep_checkpoints=1)
    scratch = dict(steps=g("scratch_steps"), batch_size=g("scratch_batch_size"), seq_len=g("scratch_seq_len"),
                   lr=g("scratch_lr"), warmup=max(1, g("scratch_steps") // 20), p_max=g("p_max"),
                   e_scale=g("e_scale"), scale=g("scale"), curriculum="rotational",
                   curriculum_param=g("scratch_rotation"), seed=g("seed"), weight_decay=0.1,
                   checkpoint_every=g("checkpoint_every"), keep_checkpoints=1)
    base = f"scratch:{g('scratch_config')}"
    return {"layerskip": Recipe(g("model"), cont, g("seed")),
            "scratch-baseline": Recipe(base, TrainConfig(**scratch, recipe=False), g("seed")),
            "scratch-layerskip": Recipe(base, TrainConfig(**scratch, recipe=True), g("seed"))}


def recipes_for_profile(profile: str, model: str | None = None) -> dict[str, Recipe]:
    """The recipes chapter 6 trains under ``profile`` (profiles/<profile>.yml); chapters 7 and 8 load them.

    ``model``, when given, must be the profile's model: the trained checkpoint is of that model."""
    from ..book import runner

    prof = runner.load_profile(profile)
    p = prof.parameters("06_training")
    if model is not None and model != p["model"]:
        raise ValueError(f"profile {profile!r} trains {p['model']!r} in chapter 6, not {model!r}; run chapter 6 "
                         f"with model={model!r} under a profile of your own, or use model={p['model']!r}")
    return recipes(p)


def history_frame(run: Run):
    """The training history of ``run`` as a DataFrame (one row a step)."""
    import pandas as pd

    h = run.history
    df = pd.DataFrame({k: h[k] for k in ("step", "loss", "final_ce", "lr", "n_exits", "seconds")})
    df["step"] = df["step"] + 1
    return df


def layer_agreement(lm, n_blocks: int, seq_len: int, batch_size: int = 4):
    """Per held-out block and per layer: agreement of the layer's exit (final norm + shared head) with the
    last layer's top-1, and the exit's cross-entropy against the true next token (nats). Cached by the
    model's weights. Columns: block, layer (1-based: layers run), agreement, loss, tokens."""
    import pandas as pd

    from ..book import store
    from .loop import per_layer_agreement

    def compute():
        rows = []
        blocks = heldout_blocks(lm.tokenizer, n_blocks, seq_len, batch_size=1)
        for b, ids in enumerate(blocks):
            df = per_layer_agreement(lm.model, ids.to(lm.device))
            for r in df.itertuples():
                rows.append({"block": b, "layer": int(r.layer) + 1, "agreement": float(r.agreement),
                             "loss": float(r.loss), "tokens": int(ids.shape[1] - 1)})
        return pd.DataFrame(rows)

    return store.cached("layer_agreement", {"n_blocks": n_blocks, "seq_len": seq_len}, compute, model=lm)

"""Trained checkpoints for the LayerSkip chapters: keyed by a hash of everything that determines them,
reused when present, built (and resumed after an interruption) when not.

    r = trained.Recipe(base="smollm2-135m", cfg=TrainConfig(steps=40, ...))
    run = trained.ensure(r)          # trains if missing; returns the final checkpoint and its history
    lm = trained.load(r)             # a LoadedModel carrying the trained weights

``base`` is a model spec of :func:`earlyexit.engine.models.load_model` (continual pre-training of its weights)
or ``"scratch:<name>"`` for a model of one of the :data:`~earlyexit.engine.models.SCRATCH` configs built with
Hugging Face's own initialisation and trained from nothing. Checkpoints live under ``data/checkpoints/<label>-<key>/``, where
``key`` hashes the base model's weights (or the scratch config), the TrainConfig, the training data (seed,
split and this Python's standard library version, which is the corpus) and the batch layout.
Which recipes the book's chapters train, from a profile's parameters, is the book's business
(:mod:`earlyexit.experiments.trained`).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..store import claims
from .. import paths
from .. import corpus as data_mod
from ..engine.models import (EMBEDDED, GGUF_SHA256, SCRATCH, TINY, LoadedModel, embedded_tokenizer, load_model,
                             resolve_device, resolve_dtype, sha256_file, small_model)
from ..files import canonical
from ..progress import say
from . import distributed as dist_
from .loop import CHECKPOINT_NAME, latest_checkpoint, load_checkpoint_weights, train
from .recipe import LATER_DEFAULTS, RESUME_FREE, TrainConfig

CHECKPOINTS = paths.DATA / "checkpoints"
FORMAT = 1  # bump when the meaning of a checkpoint's key changes

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
        kind = ("distill" if self.cfg.exit_target == "distill" else "layerskip") if self.cfg.recipe else "baseline"
        return f"{stem}-{kind}"

    def key(self) -> str:
        train = {k: v for k, v in asdict(self.cfg).items()
                 if k not in RESUME_FREE and not (k in LATER_DEFAULTS and v == LATER_DEFAULTS[k])}
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
    if spec == EMBEDDED:
        return GGUF_SHA256
    if spec in TINY:
        return f"{spec}:seed0"
    p = Path(spec).expanduser()
    if p.exists():
        files = sorted(p.glob("*.safetensors"))
        return ",".join(sha256_file(f) for f in files) or str(p.resolve())
    return spec  # a hub id: its revision is what the local cache holds


def _base_loaded(recipe: Recipe, device: str = "cpu"):
    """The LoadedModel training starts from (for a scratch recipe: the fresh init)."""
    device = resolve_device(device)
    if not recipe.scratch:
        return load_model(recipe.base, device=device, dtype=torch.float32)
    model = small_model(recipe.scratch_name, recipe.cfg.seed, init="hf").to(device=device, dtype=torch.float32)
    digest = hashlib.sha256(canonical(SCRATCH[recipe.scratch_name]).encode() +
                            str(recipe.cfg.seed).encode()).hexdigest()
    return LoadedModel(recipe.base, model.eval(), embedded_tokenizer(), digest,
                       f"scratch init ({recipe.scratch_name}), seed {recipe.cfg.seed}",
                       {"seed": recipe.cfg.seed})


class Batches:
    """``blocks(step)`` for :func:`earlyexit.training.loop.train`: deterministic batches of the training stream.

    Step ``s`` gets blocks ``s·B .. s·B + B - 1`` of :func:`earlyexit.corpus.token_stream` (training split,
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


def ensure(recipe: Recipe, device: str = "cpu", progress: bool = True, root: Path | None = None,
           parallel: str = "ddp") -> Run:
    """The finished checkpoint of ``recipe``: reused if complete, else trained (resuming a partial run).

    Several processes that need the same missing checkpoint (two chapters run at once) train it once: one
    holds a claim on it (:mod:`earlyexit.store.claims`, the file ``<label>-<key>.claim`` beside its folder) while
    the others wait and then read it; a killed trainer's claim is taken over and its run resumed.
    Under ``torchrun`` every process calls this; they train together (``parallel``: "ddp" or "fsdp") and rank 0
    writes."""
    d = recipe.directory(root)
    if not is_complete(recipe, root) and not dist_.launched():
        held = claims.acquire(d.with_name(d.name + ".claim"), f"training {d.name}",
                              until=lambda: is_complete(recipe, root),
                              on_wait=say)
        if held is not None:
            with held:
                return _ensure(recipe, device, progress, root, parallel)
    return _ensure(recipe, device, progress, root, parallel)


def _ensure(recipe: Recipe, device: str, progress: bool, root: Path | None, parallel: str) -> Run:
    d = recipe.directory(root)
    if is_complete(recipe, root):
        ck = latest_checkpoint(d)
        meta = json.loads((ck / "train_meta.json").read_text())
        return Run(recipe, ck, meta["history"], False)
    w = dist_.world(device)  # rank 0 of 1 unless started by torchrun
    lm = _base_loaded(recipe, dist_.device_for(device, w))
    batches = Batches(lm.tokenizer, recipe.cfg.batch_size, recipe.cfg.seq_len, recipe.data_seed)
    d.mkdir(parents=True, exist_ok=True)
    if w.main:
        (d / "recipe.json").write_text(json.dumps({"base": recipe.base, "data_seed": recipe.data_seed,
                                                   "config": asdict(recipe.cfg), "key": recipe.key()}, indent=1))
    history = train(lm.model, batches, recipe.cfg, checkpoint_dir=d, progress=progress, parallel=parallel)
    return Run(recipe, latest_checkpoint(d), history, True)


def snapshots(recipe: Recipe, root: Path | None = None) -> dict[int, Path]:
    """{step: folder} of the weights kept along ``recipe``'s run (every checkpoint it wrote, when its
    TrainConfig has ``keep_weights``; else only the newest ones), oldest first."""
    d = recipe.directory(root)
    found = {int(m.group(1)): p for p in (d.iterdir() if d.is_dir() else ())
             if p.is_dir() and (m := CHECKPOINT_NAME.match(p.name)) and (p / "model.safetensors").is_file()}
    return dict(sorted(found.items()))


def load(recipe: Recipe, device: str = "auto", dtype=None, root: Path | None = None, train_if_missing: bool = True,
         progress: bool = True, step: int | None = None):
    """A LoadedModel with the weights of ``recipe``'s finished checkpoint (trained first if missing and
    ``train_if_missing``), on ``device`` in ``dtype`` (default as :func:`earlyexit.engine.models.load_model`).
    ``step``: the weights after that many steps instead (one of :func:`snapshots`)."""
    if not is_complete(recipe, root):
        if not train_if_missing:
            raise FileNotFoundError(f"no finished checkpoint for {recipe.label()} under {recipe.directory(root)}; "
                                    f"build it with `python -m earlyexit train --profile <profile>`")
        ensure(recipe, device=device, progress=progress, root=root)
    if step is None:
        ck = latest_checkpoint(recipe.directory(root))
    else:
        snaps = snapshots(recipe, root)
        if step not in snaps:
            raise ValueError(f"{recipe.label()} kept no weights after step {step!r}; kept: "
                             f"{', '.join(map(str, snaps)) or 'none'} (TrainConfig.keep_weights keeps every checkpoint)")
        ck = snaps[step]
    base = _base_loaded(recipe, "cpu")
    load_checkpoint_weights(base.model, ck)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    model = base.model.to(device=dev, dtype=dt).eval()
    rel = paths.relative(ck)
    at = "" if step is None else f"/step{step}"
    return LoadedModel(f"{recipe.base}+{recipe.label().rsplit('-', 1)[-1]}@{recipe.key()}{at}", model, base.tokenizer,
                       sha256_file(ck / "model.safetensors"), f"trained checkpoint {rel}",
                       {"base": recipe.base, "train_key": recipe.key(), "data_seed": recipe.data_seed,
                        "train_config": asdict(recipe.cfg)})


def history_frame(run: Run):
    """The training history of ``run`` as a DataFrame (one row a step)."""
    import pandas as pd

    h = run.history
    df = pd.DataFrame({k: h[k] for k in ("step", "loss", "final_ce", "lr", "n_exits", "seconds")})
    df["step"] = df["step"] + 1
    return df

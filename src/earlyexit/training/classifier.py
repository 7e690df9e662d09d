"""Training CALM's early-exit classifier (:mod:`earlyexit.engine.classifier`) for one model, in seconds to minutes.

Labels come from oracle runs on TRAINING prompts (code and prose of the corpus's training split, so never an
evaluation prompt; instructions have no split and are left out): the full model decodes each prompt greedily,
then one teacher-forced pass over prompt + continuation gives every layer's hidden state at every generated
position, and the label of (position, layer n) is whether the exit after layer n (final norm + shared head)
already predicts the full model's token. The classifier then learns ``P(label = 1 | norm(h_n), n)`` by
logistic regression (cross-entropy, Adam, seeded shuffling), on layers ``min_layer .. L-1``.

    cfg = ClassifierConfig(n_prompts=64, n_new=32, min_layer=15)
    folder = ensure(lm, cfg)              # trains if missing; resumes after the labels if interrupted
    decode(lm, prompts, DecodeConfig.early_exit("classifier", "lazy-recompute", classifier=folder.name,
                                                threshold=0.9, min_layer=15), 32)

A classifier lives in ``data/checkpoints/classifier-<key>/`` with ``key`` a hash of the model's weights, the
configuration and the corpus (the Python version); the labels are kept there too, so a rerun after a kill
trains without decoding again, and training twice gives the same weights.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..store import claims
from .. import corpus, paths
from ..engine import DecodeConfig, decode
from ..engine.adapter import adapter
from ..engine.classifier import ExitClassifier, load_classifier, save_classifier
from ..files import atomic_dir, canonical
from ..progress import say
from .forward import forward_layers

FORMAT = 1


@dataclass(frozen=True)
class ClassifierConfig:
    """What a classifier depends on besides the model (see the module docstring)."""

    n_prompts: int = 64            # training prompts (code + prose, training split)
    n_new: int = 32                # tokens the full model generates per prompt (the labelled positions)
    max_prompt_tokens: int = 96
    min_layer: int = 1             # lowest layer labelled (the rules never ask below their min_layer)
    hidden: int = 64               # hidden units (0: linear)
    epochs: int = 30
    batch_size: int = 512
    lr: float = 3e-3
    weight_decay: float = 1e-4
    seed: int = 0

    def __post_init__(self):
        for name in ("n_prompts", "n_new", "max_prompt_tokens", "min_layer", "epochs", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"ClassifierConfig.{name} must be an int >= 1, got {v!r}")
        if not isinstance(self.hidden, int) or self.hidden < 0:
            raise ValueError(f"ClassifierConfig.hidden must be an int >= 0 (0: linear), got {self.hidden!r}")
        if not (self.lr > 0 and self.weight_decay >= 0):
            raise ValueError("ClassifierConfig needs lr > 0 and weight_decay >= 0")


def key(lm, cfg: ClassifierConfig) -> str:
    blob = canonical({"format": FORMAT, "weights_sha256": lm.weights_sha256, "config": asdict(cfg),
                      "corpus": corpus.python_version()})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def directory(lm, cfg: ClassifierConfig, root: Path | None = None) -> Path:
    return Path(root or paths.DATA / "checkpoints") / f"classifier-{key(lm, cfg)}"


@torch.inference_mode()
def oracle_labels(lm, ids_list: list[list[int]], n_new: int, min_layer: int) -> dict:
    """Features and labels over the full model's own continuations of ``ids_list``: ``normed`` (N, D) the final
    norm of each layer's hidden state, ``layer`` (N,) 1-based, ``label`` (N,) 1.0 where that layer's exit
    predicts the full model's token, ``prompt`` (N,) and ``t`` (N,) the position's prompt and token index."""
    A = adapter(lm)
    L = A.L
    full = decode(lm, ids_list, DecodeConfig.full(), n_new)
    feats, layers, labels, prompts_, ts = [], [], [], [], []
    lo = max(1, min(min_layer, L - 1))
    for b, ids in enumerate(ids_list):
        gen = full.sequences()[b]
        seq = torch.tensor([list(ids) + gen[:-1]], device=A.device)
        hs = forward_layers(A.model, seq, collect=range(L))
        sl = slice(len(ids) - 1, len(ids) - 1 + len(gen))
        target = A.logits(hs[L - 1][0, sl]).argmax(-1)
        for n in range(lo, L):                              # exit after n layers = hidden state index n - 1
            normed = A.norm(hs[n - 1][0, sl])
            pred = A.head(normed).argmax(-1)
            feats.append(normed.float().cpu())
            layers.append(torch.full((len(gen),), n))
            labels.append((pred == target).float().cpu())
            prompts_.append(torch.full((len(gen),), b))
            ts.append(torch.arange(len(gen)))
    return {"normed": torch.cat(feats), "layer": torch.cat(layers), "label": torch.cat(labels),
            "prompt": torch.cat(prompts_), "t": torch.cat(ts)}


def training_prompts(lm, cfg: ClassifierConfig) -> list[list[int]]:
    """The training prompts' token ids: code and prose from the corpus's training split."""
    ps = corpus.load_prompts("code+prose", cfg.n_prompts, cfg.seed, split="train", tokenizer=lm.tokenizer,
                             max_prompt_tokens=cfg.max_prompt_tokens)
    return corpus.encode(ps, lm.tokenizer, cfg.max_prompt_tokens)


def fit(data: dict, hidden_size: int, num_layers: int, cfg: ClassifierConfig) -> tuple[ExitClassifier, list]:
    """Logistic regression of ``data["label"]`` on (normed state, layer); deterministic given ``cfg.seed``.
    Returns the classifier and the mean training loss of each epoch."""
    gen = torch.Generator().manual_seed(cfg.seed)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        clf = ExitClassifier(hidden_size, num_layers, cfg.hidden)
    opt = torch.optim.Adam(clf.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    X, n, y = data["normed"].float(), data["layer"].long(), data["label"].float()
    history = []
    clf.train()
    for _ in range(cfg.epochs):
        order = torch.randperm(len(y), generator=gen)
        total = 0.0
        for i in range(0, len(y), cfg.batch_size):
            idx = order[i:i + cfg.batch_size]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(clf(X[idx], n[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        history.append(total / len(y))
    return clf.eval(), history


def ensure(lm, cfg: ClassifierConfig, root: Path | None = None) -> Path:
    """The folder of ``lm``'s classifier for ``cfg``: reused if complete, else trained (the labels, once
    computed, are kept beside it, so an interrupted run only redoes the fitting). Of several processes that
    need it at once, one trains it under a claim (:mod:`earlyexit.store.claims`) and the others wait and read it."""
    d = directory(lm, cfg, root)
    done = (d / "classifier.json").is_file
    if done():
        return d
    held = claims.acquire(d.with_name(d.name + ".claim"), f"classifier {d.name}", until=done, on_wait=say)
    if held is None:
        return d
    with held:
        return d if done() else _train(lm, cfg, d)


def _train(lm, cfg: ClassifierConfig, d: Path) -> Path:
    labels_dir = d.with_name(d.name + ".labels")
    labels_file = labels_dir / "labels.pt"
    if labels_file.is_file():
        data = torch.load(labels_file, weights_only=True)
    else:
        data = oracle_labels(lm, training_prompts(lm, cfg), cfg.n_new, cfg.min_layer)
        with atomic_dir(labels_dir, prefix=".tmp-labels-") as tmp:
            torch.save(data, tmp / "labels.pt")
    A = adapter(lm)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                  # the same bits on every machine size
    try:
        clf, history = fit(data, A.config.hidden_size, A.L, cfg)
    finally:
        torch.set_num_threads(threads)
    meta = {"weights_sha256": lm.weights_sha256, "model": lm.spec, "config": asdict(cfg), "key": key(lm, cfg),
            "positives": float(data["label"].mean()), "examples": int(len(data["label"])), "loss": history,
            "flops_per_decision": clf.flops()}
    with atomic_dir(d, prefix=".tmp-classifier-") as tmp:
        save_classifier(clf, tmp, meta)
    return d


def load(lm, cfg: ClassifierConfig, root: Path | None = None) -> tuple[ExitClassifier, dict]:
    """``lm``'s classifier for ``cfg`` (trained first if missing) and its metadata."""
    d = ensure(lm, cfg, root)
    A = adapter(lm)
    return load_classifier(d, hidden_size=A.config.hidden_size, num_layers=A.L, weights_sha256=lm.weights_sha256)


def describe(folder: Path) -> dict:
    """The metadata of a trained classifier (its classifier.json)."""
    return json.loads((Path(folder) / "classifier.json").read_text())

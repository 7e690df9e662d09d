"""CALM's learned early-exit classifier (Schuster et al., 2022, §3.5: the "early-exit classifier" confidence
measure): a small model on the hidden state that says "exiting here keeps the full model's token", so a rule
can decide without reading the vocabulary head.

One classifier is shared by every layer, with the layer as an input (as in CALM):

    score(h, n) = w2 · relu(W1 · [norm_n(h); e_n] + b1) + b2        (hidden > 0)
    score(h, n) = w · [norm_n(h); e_n] + b                           (hidden = 0: linear)

where ``norm_n`` is the model's own final RMSNorm applied to the layer-n hidden state and ``e_n`` a one-hot
of the layer. It costs ``(D + L)·hidden + hidden`` multiply-adds a decision (``D + L`` when linear), against
``V·D`` for the head (on SmolLM2-135M about 37 thousand against 28 million).

A classifier is saved as a folder: ``classifier.safetensors`` (its weights) and ``classifier.json`` (its
shape, the model it was trained for, how it was trained). :func:`load_classifier` refuses a folder that is
not one, or that belongs to another model.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

FORMAT = 1


class ExitClassifier(torch.nn.Module):
    """``score(h, n)`` (see the module docstring): logits of "exiting after layer n keeps the token"."""

    def __init__(self, hidden_size: int, num_layers: int, hidden: int = 64):
        super().__init__()
        self.hidden_size, self.num_layers, self.hidden = hidden_size, num_layers, hidden
        d_in = hidden_size + num_layers
        if hidden > 0:
            self.net = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
        else:
            self.net = torch.nn.Linear(d_in, 1)

    def features(self, normed: torch.Tensor, n: int | torch.Tensor) -> torch.Tensor:
        """[normed hidden state; one-hot of layer n (1-based)] for rows (b, D)."""
        b = normed.shape[0]
        onehot = torch.zeros(b, self.num_layers, dtype=normed.dtype, device=normed.device)
        idx = (torch.as_tensor(n, device=normed.device).expand(b) - 1).long()
        onehot[torch.arange(b, device=normed.device), idx] = 1
        return torch.cat([normed, onehot], dim=-1)

    def forward(self, normed: torch.Tensor, n) -> torch.Tensor:
        return self.net(self.features(normed, n)).squeeze(-1)

    def flops(self) -> int:
        """Multiply-adds of one decision."""
        d_in = self.hidden_size + self.num_layers
        return d_in * self.hidden + self.hidden if self.hidden > 0 else d_in


def save_classifier(clf: ExitClassifier, folder, meta: dict) -> None:
    """Write ``clf`` and ``meta`` (which must name the model: ``weights_sha256``) into ``folder``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in clf.state_dict().items()},
              str(folder / "classifier.safetensors"))
    shape = {"hidden_size": clf.hidden_size, "num_layers": clf.num_layers, "hidden": clf.hidden}
    (folder / "classifier.json").write_text(json.dumps({"format": FORMAT, "shape": shape, **meta}, indent=1,
                                                       sort_keys=True))


def load_classifier(folder, *, hidden_size: int | None = None, num_layers: int | None = None,
                    weights_sha256: str | None = None) -> tuple[ExitClassifier, dict]:
    """The classifier saved in ``folder`` and its metadata. Raises ValueError, naming what is expected, if the
    folder holds no classifier, or if it was trained for another model (hidden size, depth or weights)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta_path, w_path = folder / "classifier.json", folder / "classifier.safetensors"
    if not meta_path.is_file() or not w_path.is_file():
        raise ValueError(f"{folder} holds no exit classifier (expected classifier.json and classifier.safetensors; "
                         f"train one with earlyexit.training.classifier.ensure)")
    try:
        meta = json.loads(meta_path.read_text())
        shape = meta["shape"]
    except (ValueError, KeyError) as e:
        raise ValueError(f"{meta_path} is not a classifier description ({e.__class__.__name__})") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{meta_path} has format {meta.get('format')!r}; this code reads format {FORMAT}")
    wrong = []
    if hidden_size is not None and shape["hidden_size"] != hidden_size:
        wrong.append(f"hidden size {shape['hidden_size']} (the model has {hidden_size})")
    if num_layers is not None and shape["num_layers"] != num_layers:
        wrong.append(f"{shape['num_layers']} layers (the model has {num_layers})")
    if weights_sha256 is not None and meta.get("weights_sha256") not in (None, weights_sha256):
        wrong.append(f"weights {str(meta.get('weights_sha256'))[:12]}… (the model's are {weights_sha256[:12]}…)")
    if wrong:
        raise ValueError(f"the exit classifier in {folder} was trained for another model: " + "; ".join(wrong)
                         + f" ({meta.get('model', 'unknown model')}); train one for this model")
    clf = ExitClassifier(shape["hidden_size"], shape["num_layers"], shape["hidden"])
    clf.load_state_dict(load_file(str(w_path)))
    return clf.eval(), meta

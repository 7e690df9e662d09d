"""Models whose draft acceptance is set by construction, for timing self-speculation at real shapes.

Timing does not depend on what the weights are, only on their shapes. Scale the output projections (attention
output ``o_proj`` and MLP ``down_proj``) of every layer above the exit layer E by ``s``:

* ``s = 0`` (:func:`accepting`): those layers add nothing to the residual stream, so the hidden state after E is
  the one after the last layer, the exit at E predicts exactly what full depth predicts and every draft is accepted,
  while each layer still costs what it always costs (a product with zeros takes as long as any other);
* ``s`` well above 1 (:func:`rejecting`): the upper layers' contributions dominate the residual stream, so full
  depth predicts something else than the exit at E and (almost) every draft is rejected.

Random weights drawn as Hugging Face draws them (:func:`earlyexit.experiments.shapes.random_model`) make a model
whose prediction hardly depends on the token (each layer adds much the same vector), so with ``s = 1`` the exit and
full depth often agree anyway, prompt by prompt all or nothing: the acceptance of a constructed model is measured,
never assumed, and the in-between acceptances come from the cost model.

    accepting(model, exit_layer=8)          # every draft accepted
    rejecting(model, exit_layer=8)          # drafts rejected: measure the acceptance
"""
from __future__ import annotations

import torch


def _layers(model):
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no decoder layers at .model.layers: a Llama-family causal LM "
                         f"is needed")
    return layers


@torch.no_grad()
def scale_above(model, exit_layer: int, scale: float):
    """Scale, in place, the output projections of the layers above ``exit_layer`` (1-based: layers
    ``exit_layer + 1 .. L`` in the book's numbering) by ``scale`` (0 to 1000); returns ``model``."""
    layers = _layers(model)
    L = len(layers)
    if not isinstance(exit_layer, int) or isinstance(exit_layer, bool) or not 1 <= exit_layer < L:
        raise ValueError(f"exit_layer must be an int in [1, {L - 1}] (L = {L}), got {exit_layer!r}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0.0 <= scale <= 1000.0:
        raise ValueError(f"scale must be a number in [0, 1000] (0: every draft accepted), got {scale!r}")
    for layer in list(layers)[exit_layer:]:
        for proj in (layer.self_attn.o_proj, layer.mlp.down_proj):
            proj.weight.mul_(scale)
            if getattr(proj, "bias", None) is not None:
                proj.bias.mul_(scale)
    return model


def accepting(model, exit_layer: int):
    """``model`` with the layers above ``exit_layer`` silenced: a draft from ``exit_layer`` is always accepted."""
    return scale_above(model, exit_layer, 0.0)


def rejecting(model, exit_layer: int, scale: float = 4.0):
    """``model`` with the layers above ``exit_layer`` amplified ``scale`` times: drafts from ``exit_layer`` are
    (almost) all rejected. Measure the acceptance: it is a property of the weights, not a guarantee."""
    return scale_above(model, exit_layer, scale)

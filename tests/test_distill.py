"""Self-distillation as the early-exit target: exits learn the last layer's detached distribution."""
import pytest
import torch
import torch.nn.functional as F

from earlyexit.engine.models import tiny_model
from earlyexit.training.checkpoints import Recipe
from earlyexit.training.forward import early_exit_loss, exit_logits, forward_layers
from earlyexit.training.recipe import TrainConfig


def batch(seed=0, B=2, S=12):
    return torch.randint(3, 5000, (B, S), generator=torch.Generator().manual_seed(seed))


def test_distill_loss_is_the_cross_entropy_against_the_last_layers_distribution():
    torch.manual_seed(0)
    model = tiny_model("tiny-llama")
    L = model.config.num_hidden_layers
    ids = batch()
    w = torch.tensor([1.0, 0.5])
    loss, per = early_exit_loss(model, ids, [1, L - 1], w, target="distill")
    with torch.no_grad():
        hs = forward_layers(model, ids, collect=[1, L - 1])
        soft = torch.softmax(exit_logits(model, hs[L - 1][:, :-1]).float(), -1)
        want1 = -(soft * F.log_softmax(exit_logits(model, hs[1][:, :-1]).float(), -1)).sum(-1).mean()
        lg = exit_logits(model, hs[L - 1][:, :-1]).float()
        want_last = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), ids[:, 1:].reshape(-1))   # the data, always
    assert per[1] == pytest.approx(float(want1), rel=1e-5)
    assert per[L - 1] == pytest.approx(float(want_last), rel=1e-5)
    assert float(loss) == pytest.approx(float(want1 + 0.5 * want_last), rel=1e-5)


def test_distill_targets_are_detached_so_layers_above_the_exit_get_no_gradient():
    model = tiny_model("tiny-llama")
    L = model.config.num_hidden_layers
    loss, _ = early_exit_loss(model, batch(1), [1], torch.tensor([1.0]), target="distill")
    loss.backward()
    layers = model.model.layers
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in layers[0].parameters())
    for l in range(2, L):
        assert all(p.grad is None or p.grad.abs().sum() == 0 for p in layers[l].parameters()), l


def test_exit_target_is_checked_and_leaves_earlier_recipe_keys_unchanged():
    with pytest.raises(ValueError, match="exit_target must be one of data, distill"):
        TrainConfig(exit_target="logits")
    cfg = TrainConfig(steps=3)
    assert Recipe("tiny-llama", cfg, 0).key() == Recipe("tiny-llama", TrainConfig(steps=3, exit_target="data"), 0).key()
    assert Recipe("tiny-llama", TrainConfig(steps=3, exit_target="distill"), 0).key() != Recipe("tiny-llama", cfg, 0).key()

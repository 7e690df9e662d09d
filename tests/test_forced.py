"""A model with the output projections above E zeroed accepts every draft from E, and its output is full depth's;
amplified, it rejects them; either way self-speculation stays lossless."""
import pytest

from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.models import tiny_model
from earlyexit.experiments import forced, shapes

IDS = [[5, 6, 7, 8, 9], [11, 12, 13]]


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-qwen2"])
def test_zeroed_projections_accept_every_draft_losslessly(spec):
    model = forced.accepting(tiny_model(spec), exit_layer=2)
    full = decode(model, IDS, DecodeConfig.full(), 12, stop_at_eos=False)
    for b, p in enumerate(IDS):
        sp = decode(model, [p], DecodeConfig.self_speculation(2, 3), 12, stop_at_eos=False)
        assert sp.acceptance == 1.0
        assert sp.sequences()[0] == full.sequences()[b], "self-speculation stays full depth's output"
    ex = decode(model, IDS, DecodeConfig.early_exit("static", "naive-mask", layer=2), 12, stop_at_eos=False)
    assert ex.tokens.tolist() == full.tokens.tolist(), "the exit at E predicts what full depth predicts"


def test_a_random_model_of_a_published_shape_is_accepted_or_rejected_by_construction():
    """SmolLM2-135M's shape with random weights: zeroed above E every draft is accepted; amplified none is."""
    p = list(range(1000, 1030))
    acc = {}
    for name, build in (("accepting", forced.accepting), ("rejecting", forced.rejecting)):
        model = build(shapes.random_model("SmolLM2-135M", seed=0), 15)
        sp = decode(model, [p], DecodeConfig.self_speculation(15, 2), 10, stop_at_eos=False)
        full = decode(model, [p], DecodeConfig.full(), 10, stop_at_eos=False)
        assert sp.sequences() == full.sequences(), "lossless either way"
        acc[name] = sp.acceptance
    assert acc == {"accepting": 1.0, "rejecting": 0.0}


def test_bad_arguments_are_refused():
    m = tiny_model("tiny-llama")
    with pytest.raises(ValueError, match=r"exit_layer must be an int in \[1, 5\]"):
        forced.accepting(m, exit_layer=6)
    with pytest.raises(ValueError, match=r"scale must be a number in \[0, 1000\]"):
        forced.scale_above(m, exit_layer=2, scale=-1)

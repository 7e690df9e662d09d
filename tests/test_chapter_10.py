"""Chapter 10's library: predictions against the published numbers, break-even tables, and every sentence whose
wording depends on a result, branch by branch (no "0.35 and 0.35", no repeated clause, no "1 bounds")."""
import math

import numpy as np
import pandas as pd
import pytest

from earlyexit.book import schemas
from earlyexit.chapters import ch10
from earlyexit.experiments import roofline, shapes


def test_the_schema_lists_the_registered_shapes():
    assert set(schemas._SHAPE_NAMES) == set(shapes.SHAPES)


def test_the_gpus_reproduce_the_published_time_they_are_fitted_on():
    pub = ch10.published()
    devices, row = ch10.gpus(pub)
    s = shapes.shape("Llama-2-7B")
    assert roofline.step_seconds(s, devices["a100-80gb"], "float16") * 1e3 == pytest.approx(row["ar_ms_per_token"])
    assert len({d.launch_us for d in devices.values()}) == 1, "one framework cost on every GPU"
    preds = ch10.predictions(pub, devices)
    assert set(preds["gpu"]) <= set(ch10.GPUS) and not preds.empty
    with_acc = preds[preds["acceptance"].notna()]
    assert np.isfinite(with_acc["predicted"]).all() and (with_acc["predicted"] > 0).all()
    assert "Llama-1.5B" not in set(preds["shape"]), "a shape that is not registered is left out"


def test_break_even_on_a_gpu_and_here():
    units = {"SmolLM2-135M": roofline.units(shapes.shape("SmolLM2-135M"), roofline.device("h200"), "float32")}
    be = ch10.break_even(units, {"h200": roofline.device("h200")}, ["SmolLM2-135M"], 0.25, 4, batches=(1, 8))
    assert set(be["device"]) == {"this CPU", "h200"} and (be["break_even"].between(0, 1) | be["break_even"].isna()).all()


def test_error_sentence_none_one_many():
    assert ch10.error_sentence([], 0.2, "bound") == "No bound could be compared."
    one = ch10.error_sentence([0.1], 0.2, "bound")
    assert one == "For the one bound the relative error is 10%, within the 20% goal."
    many = ch10.error_sentence([0.1, -0.3, 0.25], 0.2, "bound")
    assert many.startswith("Over 3 bounds the median relative error is 25%, outside") and "worst 30%" in many
    assert "speed-ups with an accepted share" in ch10.error_sentence([0.1, 0.2], 0.2, "speed-up with an accepted "
                                                                     "share", "speed-ups with an accepted share")


def test_misses_join_runs_of_one_configuration():
    worst = pd.DataFrame({"shape": ["Llama-2-7B"] * 2, "E": [8, 8], "d": [12, 12], "source": ["log"] * 2,
                          "published": [1.04, 1.12], "predicted": [1.54, 1.52]})
    s = ch10.misses_sentence(worst)
    assert s.count("Llama-2-7B") == 1 and "2 runs" in s and "1.04 and 1.12 published" in s
    one = ch10.misses_sentence(worst.iloc[:1])
    assert one.startswith("The largest miss is ") and "runs" not in one
    assert ch10.misses_sentence(worst.iloc[:0]) == ""


def test_map_notes_one_value_or_a_range():
    be = pd.DataFrame({"shape": ["a", "b"], "device": ["this CPU"] * 2, "batch": [1, 1], "break_even": [0.35, 0.35]})
    assert "at an accepted share of 0.35 at batch 1, across the 2 shapes" in ch10.map_notes(be)["map_here"]
    be["break_even"] = [0.3, 0.4]
    assert "between 0.30 and 0.40" in ch10.map_notes(be)["map_here"]
    assert ch10.map_notes(be.iloc[:1])["map_here"].endswith("for the shape timed here.")


def test_batch_sentence_pays_shrinks_or_never():
    be = pd.DataFrame({"shape": ["a", "b", "a", "b"], "device": ["h200"] * 4, "batch": [1, 1, 64, 64],
                       "break_even": [0.25, 0.27, 0.30, float("nan")]})
    s = ch10.batch_sentence(be, "h200")
    assert "0.26 at batch 1" in s and "0.30 at batch 64" in s and "for 1 of 2 shapes no acceptance does" in s
    be.loc[be.batch == 64, "break_even"] = float("nan")
    assert ch10.batch_sentence(be, "h200").endswith("at batch 64 no acceptance makes it pay for any shape.")
    assert ch10.batch_sentence(be, "a100-80gb") == ""


def test_trained_sentence_above_below_or_out_of_reach():
    assert "above the 0.40" in ch10.trained_sentence(0.5, 0.4, "M", 8, 4)
    below = ch10.trained_sentence(0.1, 0.4, "M", 8, 4)
    assert "only at 0.40, 0.30 more" in below
    assert "would not make self-speculation" in ch10.trained_sentence(0.1, float("nan"), "M", 8, 4)


def test_oracle_bound_and_batches():
    assert ch10.oracle_bound(0.0, 0.5) == pytest.approx(2.0)
    assert ch10.oracle_bound(0.3, 1.0) == pytest.approx(1.0), "exiting at the top saves nothing"
    exits = [10, 20, 30] * 10
    assert ch10.expected_max_share(exits, 30, 1) == pytest.approx(20 / 30)
    assert ch10.expected_max_share(exits, 30, 64) == pytest.approx(1.0, abs=1e-3), "a big batch runs to the top"
    smol = shapes.shape("SmolLM2-135M")
    cfg = type("Config", (), {k: v for k, v in shapes.shape("SmolLM2-135M").config().items()})
    assert ch10.head_share_of(cfg) == pytest.approx(smol.head_to_layer() / smol.layers)
    notes = ch10.oracle_notes(exits, 30, ch10.head_share_of(cfg), [1, 64])
    assert notes["pays_batch_hi"] == 64 and "batching erases the saving" in notes["batch_sentence"]
    assert math.isclose(notes["batch_hi_bound"], 1.0, abs_tol=1e-3)


def test_bounds_at_a_shape_keep_the_timings_and_summarize_them_on_every_call(tmp_path, monkeypatch):
    """The shape_spec entry holds each construction's paired rounds, not their summary: the run-to-run spread of
    the reading process widens the interval without a second timing (it once keyed the entry, so that a change
    of the spread re-timed every bound)."""
    from earlyexit.experiments import atshape, speeds

    monkeypatch.setattr("earlyexit.paths.CACHE", tmp_path)
    b = atshape.spec_bounds("SmolLM2-135M", exit_layer=20, draft_len=2, n_new=4, n_prompts=2, prompt_len=8, rounds=1)
    assert list(b["construction"]) == list(atshape.CONSTRUCTIONS) and b["lossless"].all()
    assert (b["lo"] <= b["ratio"]).all() and (b["ratio"] <= b["hi"]).all()
    assert all(len(r.split()) == 2 for r in b["runs"]), "2 prompts x 1 round each"
    entries = sorted((tmp_path / "shape_spec").glob("*.json"))
    speeds.set_run_sd(0.05)
    wide = atshape.spec_bounds("SmolLM2-135M", exit_layer=20, draft_len=2, n_new=4, n_prompts=2, prompt_len=8,
                               rounds=1)
    assert sorted((tmp_path / "shape_spec").glob("*.json")) == entries, "read back, not timed again"
    assert (wide["ratio"] == b["ratio"]).all() and ((wide["hi"] - wide["lo"]) > (b["hi"] - b["lo"])).all()

"""Chapter 6's page (earlyexit.chapters.ch06): each word it chooses from a result, branch by branch, and the notes
and figures it builds, on small hand-made tables (no model)."""
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from earlyexit.chapters import ch06
from earlyexit.experiments import metrics
from earlyexit.training.recipe import TrainConfig


@pytest.mark.parametrize("change, word", [(0.01, "within"), (-0.05, "within"), (0.2, "outside"), (-0.06, "outside")])
def test_goal_word(change, word):
    assert ch06.goal_word(change) == word


def test_head_and_trained_now_phrases():
    assert ch06.head_phrase(True) == "the head is trained too"
    assert ch06.head_phrase(False) == "the head is frozen"
    assert ch06.trained_now_phrase(True) == "trained in this run"
    assert ch06.trained_now_phrase(False).startswith("reused from an earlier run")


@pytest.mark.parametrize("a, b, order", [((0.5, 0.6), (0.1, 0.4), 1), ((0.1, 0.2), (0.3, 0.4), -1),
                                         ((0.1, 0.35), (0.3, 0.4), 0), ((0.3, 0.4), (0.3, 0.4), 0)])
def test_measurably(a, b, order):
    assert ch06.measurably(*a, *b) == order


@pytest.mark.parametrize("order, light, off, distill", [
    (1, "higher than", "above", "raises"),
    (-1, "lower than", "below", "lowers"),
    (0, "not measurably different from", "not measurably above", "does not measurably change")])
def test_verdicts(order, light, off, distill):
    assert ch06.light_verdict(order) == light
    assert ch06.above_off_verdict(order) == off
    assert ch06.distill_verdict(order) == distill


def test_kept_phrase():
    assert ch06.kept_phrase(float("nan")).startswith("keeps nothing of the agreement gain, since")
    assert ch06.kept_phrase(0.0).startswith("keeps none of the agreement gain")
    assert ch06.kept_phrase(-0.3).startswith("keeps none of")
    assert ch06.kept_phrase(0.456).startswith("keeps 46% of the agreement gain")
    assert "nan" not in ch06.kept_phrase(float("nan"))


def test_scratch_description():
    assert ch06.scratch_description("llama-4x64") == "llama-4x64: 4 layers of width 64, the same tokenizer"


def test_schedule_notes():
    cfg = TrainConfig(curriculum="rotational", curriculum_param=2, e_scale=0.5)
    # rotational R = 2 on 6 layers: steps 0 and 1 enable {0, 2, 4, 5} and {1, 3, 5}
    assert ch06.schedule_notes(cfg, 6) == {"R_rot": 2, "e_scale": 0.5, "n_exit_mean": 3.5}
    none = ch06.schedule_notes(TrainConfig(curriculum="none"), 4)
    assert none["R_rot"] == 1 and none["n_exit_mean"] == 4.0


def test_marks():
    assert ch06.marks(30) == [15, 22, 29]
    assert ch06.marks(6) == [3, 4, 5]
    assert ch06.marks(2) == [1, 2]


def test_config_run_and_seconds_notes(tmp_path):
    cfg = TrainConfig(steps=4, batch_size=2, seq_len=32, lr=1e-4, p_max=0.1, train_embeddings=False)
    lm = SimpleNamespace(config=SimpleNamespace(vocab_size=100, hidden_size=8))
    n = ch06.config_notes(cfg, lm)
    assert n == {"p_max": 0.1, "steps": 4, "batch_size": 2, "seq_len": 32, "lr": 1e-4,
                 "train_embeddings_str": "the head is frozen", "vocab": 100, "hidden": 8}
    run = SimpleNamespace(seconds=120.0, trained_now=False, checkpoint=tmp_path / "ckpt",
                          history={"step": [0, 1, 2, 3]})
    r = ch06.run_notes(run, pd.DataFrame({"seconds": [1.0, 2.0, 3.0]}), "float32")
    assert r["train_minutes"] == 2.0 and r["s_per_step"] == 2.0 and r["precision_str"] == "float32"
    assert r["trained_now"].startswith("reused") and r["ckpt"].endswith("ckpt")
    assert ch06.seconds_per_step({"a": run, "b": SimpleNamespace(seconds=3.0, history={"step": []})}) == \
        {"a": 30.0, "b": 3.0}


def _agreement(L=4, blocks=3, shift=0.0):
    """A layer_agreement-like table: agreement rises with depth, loss falls."""
    rows = [{"block": b, "layer": l, "agreement": min(1.0, l / L + shift + 0.01 * b), "loss": 5.0 - l * 0.5 - shift + 0.1 * b,
             "tokens": 31} for b in range(blocks) for l in range(1, L + 1)]
    return pd.DataFrame(rows)


def test_change_notes():
    ag = ch06.stack({"before": _agreement(), "after": _agreement(shift=0.05)})
    sa = metrics.summarize(ag, ["model", "layer"], "agreement", n_boot=50)
    sl = metrics.summarize(ag, ["model", "layer"], "loss", n_boot=50)
    n = ch06.change_notes(ag, sa, sl, 4, n_boot=50, seed=0)
    assert (n["mark0"], n["mark1"]) == (2, 3) and "mark2" not in n
    assert n["ag_after_0"] > n["ag_before_0"]
    assert n["ppl_change"] == pytest.approx(math.expm1(-0.05))
    assert n["ppl_goal"] == "within" and n["ppl_goal_frac"] == ch06.PPL_GOAL
    assert n["gain_layer"] in (1, 2, 3) and n["gain_max"] == pytest.approx(0.05)
    assert n["mid_ppl_after"] < n["mid_ppl_before"]


def test_change_notes_outside_the_goal():
    ag = ch06.stack({"before": _agreement(), "after": _agreement(shift=-0.2)})
    sa = metrics.summarize(ag, ["model", "layer"], "agreement", n_boot=50)
    sl = metrics.summarize(ag, ["model", "layer"], "loss", n_boot=50)
    n = ch06.change_notes(ag, sa, sl, 4, n_boot=50, seed=0)
    assert n["ppl_change"] == pytest.approx(math.expm1(0.2)) and n["ppl_goal"] == "outside"


def _recipe_table(ag_ls, ag_off, ag_light, ag_distill, width=0.01):
    rows = []
    for run, a in (("layerskip", ag_ls), ("baseline", ag_off), ("light", ag_light), ("distill", ag_distill)):
        rows.append({"run": run, "ag_5": a, "ag_5_lo": a - width, "ag_5_hi": a + width, "ppl": 10.0,
                     "ppl_vs_before": -0.02, "ppl_vs_before_lo": -0.03, "ppl_vs_before_hi": -0.01,
                     "ppl_vs_baseline": 0.0 if run == "baseline" else 0.1, "ppl_vs_baseline_lo": 0.05,
                     "ppl_vs_baseline_hi": 0.15})
    return pd.DataFrame(rows)


RECIPES = {"light": SimpleNamespace(cfg=SimpleNamespace(p_max=0.05, e_scale=0.02))}


def test_variant_notes_with_every_run():
    n = ch06.variant_notes(_recipe_table(0.6, 0.2, 0.4, 0.7), 5, RECIPES)
    assert n["n_variants"] == 4 and n["var_top"] == 5
    assert n["var_ag_layerskip"] == 0.6 and n["var_goal_layerskip"] == "outside"
    assert "var_cost_baseline" not in n and n["var_cost_light_hi"] == 0.15
    assert n["var_adapt"] == -0.02
    assert n["light_kept"] == pytest.approx(0.5) and n["light_kept_str"].startswith("keeps 50%")
    assert (n["light_verdict"], n["light_above_off"]) == ("lower than", "above")
    assert n["distill_verdict"] == "raises" and n["distill_gain"] == pytest.approx(0.1)
    assert (n["light_p_max"], n["light_e_scale"]) == (0.05, 0.02)


def test_variant_notes_without_a_gain_to_keep():
    n = ch06.variant_notes(_recipe_table(0.2, 0.2, 0.2, 0.2), 5, RECIPES)
    assert math.isnan(n["light_kept"]) and "nan" not in n["light_kept_str"]
    assert n["light_verdict"] == "not measurably different from"
    assert n["light_above_off"] == "not measurably above"
    assert n["distill_verdict"] == "does not measurably change"


def test_variant_notes_of_layerskip_alone():
    n = ch06.variant_notes(_recipe_table(0.6, 0.2, 0.4, 0.7).iloc[:1], 5, {})
    assert set(n) == {"n_variants", "var_top", "var_ag_layerskip", "var_ppl_layerskip"}


def test_scratch_notes():
    sag = ch06.stack({"baseline": _agreement(), "LayerSkip": _agreement(shift=-0.1)})
    n = ch06.scratch_notes(sag, 4, {"baseline": 0.5, "LayerSkip": 1.0}, n_boot=50, seed=0)
    assert (n["s_half"], n["s_last"]) == (2, 4)
    assert n["s_cost"] == pytest.approx(math.expm1(0.1))
    assert n["s_sec_ratio"] == 2.0
    assert n["s_ag_last_baseline"] == pytest.approx(1.0)


def test_figures_draw():
    import matplotlib.pyplot as plt

    fig = ch06.recipe_figure(TrainConfig(curriculum_param=2), 6)
    assert len(fig.axes) == 2
    hist = pd.DataFrame({"step": np.arange(1, 6), "final_ce": np.linspace(5, 4, 5), "loss": np.linspace(6, 5, 5)})
    assert len(ch06.curve_figure(hist).axes) == 1
    ag = ch06.stack({"before": _agreement(), "after": _agreement(shift=0.05)})
    sa = metrics.summarize(ag, ["model", "layer"], "agreement", n_boot=20)
    sl = metrics.summarize(ag, ["model", "layer"], "loss", n_boot=20)
    fig = ch06.layers_figure(sa, sl, {"before": "model", "after": "trained"})
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["model", "trained"]
    sag = ch06.stack({"baseline": _agreement(), "LayerSkip": _agreement(shift=-0.1)})
    ssa = metrics.summarize(sag, ["model", "layer"], "agreement", n_boot=20)
    ssl = metrics.summarize(sag, ["model", "layer"], "loss", n_boot=20)
    fig = ch06.pair_figure({"baseline": hist, "LayerSkip": hist}, ssa, ssl)
    assert len(fig.axes) == 3 and len(fig.axes[1].lines) == 2
    plt.close("all")


def test_recipe_tables_split_agreement_from_perplexity_and_cost():
    shown = pd.DataFrame({"run": ["LayerSkip (data)", "recipe off"], "agreement, layer 15": ["0.40 [0.3, 0.5]"] * 2,
                          "agreement, layer 29": ["0.80 [0.7, 0.9]"] * 2, "last-layer perplexity": ["12.00", "12.50"],
                          "vs released": ["+1.0% [+0.5%, +1.5%]"] * 2, "vs recipe off": ["-4.0% [-5%, -3%]", "reference"],
                          "s/step": ["3.6", "3.4"]})
    html = ch06.recipe_tables(shown).data
    first, second = html.split("</table>")[:2]
    assert html.count("<table") == 2
    assert "layer 15" in first and "perplexity" not in first
    assert "seconds / training step" in second and "layer 15" not in second

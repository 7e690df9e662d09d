"""Chapter 8's page (earlyexit.chapters.ch08): each sentence it builds from a result, branch by branch, the notes
it reads off the comparison's tables and the figures it draws, on small hand-made tables (no model)."""
import math

import pandas as pd
import pytest

from earlyexit.book.profiles import load_profile
from earlyexit.chapters import ch08

NAN = float("nan")


def test_chapter_params_reads_the_other_chapter_under_the_same_profile():
    p9 = ch08.chapter_params({"profile": "smoke"}, "09_where_time_goes")
    assert p9 == load_profile("smoke").parameters("09_where_time_goes")
    assert p9["profile"] == "smoke" and p9["unit_ctx"] == 8


@pytest.mark.parametrize("names, joined, sentence", [
    ([], "none", "no method reaches the target"),
    (["self-speculation"], "self-speculation", "only self-speculation reaches the target"),
    (["a, b", "c"], "a, b; c", "the methods that reach the target are: a, b; c")])
def test_method_names_and_reaching_sentence(names, joined, sentence):
    assert ch08.method_names(names) == joined
    assert ch08.reaching_sentence(names) == sentence


def test_reach_word():
    assert ch08.reach_word(True) == "reaches"
    assert ch08.reach_word(False) == "does not reach"


@pytest.mark.parametrize("ts, phrase", [([0.5], "threshold 0.5"), ([0.1, 0.3], "thresholds 0.1 and 0.3"),
                                        ([0.1, 0.3, 0.5], "thresholds 0.1, 0.3 and 0.5")])
def test_thresholds_phrase(ts, phrase):
    assert ch08.thresholds_phrase(ts) == phrase


def test_lossless_phrase():
    assert ch08.lossless_phrase(38, 38) == "keep every output too (38 of 38 prompt runs equal full depth)"
    assert ch08.lossless_phrase(36, 38) == "keep the full model's output in 36 of 38 prompt runs, not in every one"


def test_fastest_sentence():
    s = ch08.fastest_sentence({"released": ("drafter (E=6 d=1)", 0.9712, 1.4764, 0.41, 2.543),
                               "distill": (ch08.NOT_TRAINED, NAN, NAN, NAN, NAN)})
    assert s == ("on the released model, drafter (E=6 d=1), predicted at 0.97× full depth and timed paired, as "
                 "chapter 7 times the speeds it quotes, at 1.48× ([0.41, 2.54]); "
                 "on the self-distilled model of chapter 6, none (the model is not trained under this profile)")
    assert "nan" not in s


def test_ltt_held_and_low_role():
    assert ch08.ltt_held(None, 0.25) == "cannot be checked"
    assert ch08.ltt_held(0.25, 0.25) == "holds"
    assert ch08.ltt_held(0.3, 0.25) == "does not hold"
    assert ch08.ltt_low_role(True) == "the lowest candidate, accepted like every one before it"
    assert ch08.ltt_low_role(False) == "the first threshold it cannot reject"


def _det(accepted):
    thr = [1.0, 0.9, 0.5][:len(accepted)]
    return pd.DataFrame({"threshold": thr, "risk_hat": [0.0, 0.1, 0.5][:len(thr)], "n": 3,
                         "p_value": [0.05, 0.08, 0.9][:len(thr)], "accepted": accepted,
                         "layers": [6.0, 5.5, 4.0][:len(thr)]})


def _res(risk=0.1):
    return pd.DataFrame([{"split": "test", "consistency": 1 - risk, "consistency_lo": 0.8, "consistency_hi": 0.95,
                          "risk": risk, "risk_lo": 0.05, "risk_hi": 0.2, "layers": 5.4, "speed": 1.1}])


def test_ltt_notes_when_no_threshold_is_accepted():
    det = _det([False]).assign(p_value=0.42)
    n = ch08.ltt_notes(None, det, None, 0.25, 0.1)
    assert (n["ltt_lambda"], n["n_accepted"], n["ltt_held"]) == ("none", 0, "cannot be checked")
    assert math.isnan(n["ltt_cal_layers"]) and math.isnan(n["ltt_test_risk"])
    assert n["ltt_low_role"] == "the first threshold it cannot reject" and n["ltt_low_thr"] == 1.0
    assert n["ltt_result"] == ("The procedure accepts no threshold: at λ = 1, the first it tests, its calibration "
                               "loss is 0.00 and its p-value 0.42, not below δ = 0.1, so no threshold is chosen and "
                               "the test half has nothing to check.")


def test_ltt_notes_with_one_threshold_accepted():
    n = ch08.ltt_notes(1.0, _det([True, False]), _res(0.1), 0.25, 0.1)
    assert (n["ltt_lambda"], n["n_accepted"], n["ltt_cal_layers"], n["ltt_held"]) == ("1", 1, 6.0, "holds")
    assert n["ltt_test_cons"] == 0.9 and n["ltt_test_speed"] == 1.1
    r = n["ltt_result"]
    assert r.startswith("The procedure accepts one threshold and chooses λ = 1, at 6.0 layers per token")
    assert "a loss of 0.10, so the bound holds there, at 5.4 layers per token and 1.10 times" in r
    assert r.endswith("The procedure stops at 0.9, the first threshold it cannot reject: its calibration loss is "
                      "0.10 and its p-value 0.08.")
    assert "threshold(s)" not in r


def test_ltt_notes_with_every_threshold_accepted():
    n = ch08.ltt_notes(0.5, _det([True, True, True]), _res(0.3), 0.25, 0.1)
    assert (n["ltt_lambda"], n["n_accepted"], n["ltt_held"]) == ("0.5", 3, "does not hold")
    assert n["ltt_low_role"] == "the lowest candidate, accepted like every one before it"
    assert n["ltt_result"].startswith("The procedure accepts 3 thresholds and chooses λ = 0.5")
    assert "the bound does not hold there" in n["ltt_result"]
    assert n["ltt_result"].endswith("The procedure stops at 0.5, the lowest candidate, accepted like every one "
                                    "before it: its calibration loss is 0.50 and its p-value 0.9.")


def _v(r, v):
    return {"ratio": r, "lo": r - 0.05, "hi": r + 0.05, "verdict": v, "digits": 2}


@pytest.mark.parametrize("lo, hi, claim", [
    (_v(1.3, "faster"), _v(0.8, "slower"), "Batches erase the saving."),
    (_v(1.3, "faster"), _v(1.0, "no different"), "Batches erase the saving."),
    (_v(1.5, "faster"), _v(1.2, "faster"), "Batches shrink the saving."),
    (_v(1.2, "faster"), _v(1.4, "faster"), "Batches do not cost the rule its speed here."),
    (_v(0.5, "slower"), _v(0.3, "slower"), "Batches make a slow rule slower still."),
    (_v(0.5, "slower"), _v(0.6, "slower"), "The rule is slower than the full model at every batch size."),
    (_v(1.0, "no different"), _v(0.7, "slower"), "In a batch the rule falls behind the full model."),
    (_v(1.0, "no different"), _v(1.3, "faster"), "Batches help the rule here."),
    (_v(0.7, "slower"), _v(1.0, "no different"), "In a batch the rule catches up with the full model."),
    (_v(1.0, "no different"), _v(1.01, "no different"),
     "Neither alone nor in a batch does the rule measurably differ from the full model in speed.")])
def test_batch_claim(lo, hi, claim):
    assert ch08.batch_claim(lo, hi) == claim


def test_batch_notes_and_table():
    bt = pd.DataFrame([{"batch": 1, **_v(1.3, "faster"), "layers": 20.0},
                       {"batch": 8, **_v(0.7, "slower"), "layers": 22.5}]).set_index("batch")
    n = ch08.batch_notes(bt)
    assert n == {"batch_lo": 1, "batch_hi": 8, "rel_lo": "1.30× [1.25, 1.35]", "rel_hi": "0.70× [0.65, 0.75]",
                 "rel_lo_vs": "faster than the full model", "rel_hi_vs": "slower than the full model",
                 "batch_layers": 22.5, "batch_claim": "Batches erase the saving."}
    t = ch08.batch_table(bt).data
    assert list(t.columns) == ["batch size", "speed / full depth [95% CI]", "layers / token"]
    assert list(t["speed / full depth [95% CI]"]) == ["1.30× [1.25, 1.35]", "0.70× [0.65, 0.75]"]


def test_batch_speeds_ask_for_chapter_fives_timings(monkeypatch):
    """Chapter 8 quotes the rule's batch-1 speed chapter 5 measured: the same prompts and rounds, so the same
    store entry (it once timed 2 prompts where chapter 5 timed 6: 0.4x [0.1, 1.4] beside 0.4x [0.3, 0.6])."""
    from earlyexit.chapters import batches
    from earlyexit.engine.models import load_model
    from earlyexit.experiments import evalset

    asked = []

    def fake(lm, es, n_new, cfg, batch=1, repeats=2):
        asked.append((len(es), batch, repeats, cfg.strategy))
        return pd.DataFrame({"round_ratios": ["0.9 0.91 0.92"] * len(es), "layers": [20.0] * len(es)})

    monkeypatch.setattr(batches.grouped.timing, "time_point", fake)
    lm = load_model("tiny-llama")
    es = evalset.eval_set(lm, "mix", 12, 0, 64)
    P = {"min_layer": 0, "rule": "softmax", "operating_threshold": 0.99, "batch_sizes": [1, 8],
         "timing_repeats": 1}
    bt = batches.batch_speeds(lm, es, 4, P, {"timing_prompts": 6, "timing_repeats": 3, "batch_groups": 2})
    assert asked == [(6, 1, 3, "copy-forward")] + [(8, 8, 3, "copy-forward")] * 2, "chapter 5's groups too"
    assert list(bt.index) == [1, 8] and bt.loc[1, "verdict"] == "slower"


def _best():
    rows = [("released", "self-speculation", "self-spec E=4 d=2", 11.1, 1.0, 0.6, True),
            ("released", "lazy-recompute", "softmax 0.9 / lazy-recompute", 6.0, 1.0, 0.45, True),
            ("released", "naive-mask", "softmax 0.9 / naive-mask", 4.0, 0.5, 1.2, False),
            ("trained", "naive-mask", "softmax 0.3 / naive-mask", 3.0, 0.4, 1.4, False)]
    return pd.DataFrame(rows, columns=["model", "method", "label", "layers", "consistency", "speed", "meets"])


def test_table_notes():
    n = ch08.table_notes(_best(), ["released", "trained", "scratch-baseline"])
    assert (n["n_meet_released"], n["names_meet_released"]) == (2, "self-speculation; lazy-recompute")
    assert n["meet_sentence_released"] == "the methods that reach the target are: self-speculation; lazy-recompute"
    assert (n["n_meet_trained"], n["names_meet_trained"]) == (0, "none")
    assert n["meet_sentence_trained"] == "no method reaches the target"
    assert (n["spec_pred_speed_released"], n["spec_layers_released"]) == (0.6, 11.1) and math.isnan(n["spec_pred_speed_trained"])
    assert n["released_lazy_recompute_label"] == "softmax 0.9 / lazy-recompute"
    assert n["released_lazy_recompute_meets"] == "reaches" and n["released_naive_mask_meets"] == "does not reach"
    assert n["trained_naive_mask_cons"] == 0.4
    assert n["trained_lazy_recompute_label"] == "none" and n["trained_lazy_recompute_meets"] == "does not reach"
    assert math.isnan(n["scratch_baseline_classifier_copy_forward_pred_speed"])


def _summ(model, method, label, speed, consistency=1.0):
    return {"model": model, "method": method, "label": label, "speed": speed, "speed_lo": speed - 0.1,
            "speed_hi": speed + 0.1, "consistency": consistency}


def test_drafter_notes_quote_chapter_7s_measurement_of_the_drafter_the_cost_model_ranks_first():
    from earlyexit.experiments import metrics

    summ = pd.DataFrame([_summ("released", "self-speculation", "E=4 d=2", 0.6),
                         _summ("released", "naive-mask", "softmax 0.9", 3.0, 0.5)])
    dsumm = pd.DataFrame([_summ("released", "layer-skip drafter", "skip 2", 1.5),
                          _summ("trained", "self-speculation, shortlist", "K=8", 0.9)])
    dpts = pd.DataFrame({"exact_match": [1.0, 1.0, 0.0], "model": ["released", "released", "trained"],
                         "method": ["layer-skip drafter", "layer-skip drafter", "self-speculation, shortlist"],
                         "label": ["skip 2", "skip 2", "K=8"], "measured": [0.8, 1.0, 0.7],
                         "acceptance": [0.6, 0.7, 0.5]})
    n = ch08.drafter_notes(summ, dsumm, dpts, {"released": None, "trained": None}, seed=3, n_boot=500)
    assert n["draft_best_released"] == "layer-skip drafter (skip 2)" and n["draft_best_pred_released"] == 1.5
    # the measured speed-up and its interval are chapter 7's: the same bootstrap of the same runs
    m, lo, hi = metrics.bootstrap_ci([0.8, 1.0], 500, seed=3)
    assert (n["draft_best_speed_released"], n["draft_best_speed_lo_released"], n["draft_best_speed_hi_released"]) == (m, lo, hi)
    assert n["draft_best_trained"] == "self-speculation, shortlist (K=8)" and n["draft_best_speed_trained"] == 0.7
    assert n["draft_best_distill"] == ch08.NOT_TRAINED and math.isnan(n["draft_best_speed_hi_distill"])
    assert (n["draft_lossless"], n["draft_runs"], n["has_distill"]) == (2, 3, False)
    assert n["draft_lossless_str"].endswith("in 2 of 3 prompt runs, not in every one")
    assert n["draft_best_str"].startswith("on the released model, layer-skip drafter (skip 2), predicted at 1.50× "
                                          "full depth and timed paired, as chapter 7 times the "
                                          "speeds it quotes, at 0.90×")
    assert n["draft_best_str"].endswith("none (the model is not trained under this profile)")


def _splits():
    rows = []
    for model in ("released", "trained"):
        for s in ("naive-mask", "lazy-recompute"):
            for i, part in enumerate(("exit_decision", "cache", "interaction", "total")):
                m = 0.0 if (s == "lazy-recompute" and part == "cache") else 0.1 * (i + 1)
                rows.append({"strategy": s, "part": part, "mean": m, "lo": m - 0.05, "hi": m + 0.05, "model": model,
                             "threshold": 0.9})
    return pd.DataFrame(rows)


def test_summary_tables_split_by_family_fold_the_controls_and_read_without_the_cache_twice():
    from earlyexit.book import plots

    tab = pd.DataFrame({"method": ["lazy-recompute", "classifier / copy-forward", "SkipDecode", "self-speculation"],
                        "M": ["softmax 0.99 / lazy-recompute: 0.97 ✓, 0.81×", "classifier 0.8 / copy-forward: 0.9, 1.2×",
                              "skipdecode 30->20: 0.50, 1.30×", "self-spec E=15 d=2: 1.00 ✓, 0.90×"],
                        "M + self-distillation": ["", "", "", "self-spec E=15 d=2: 1.00 ✓, 0.95×"],
                        "from scratch, baseline": ["softmax 0.1 / lazy-recompute: 1.00 ✓, 0.50×", "", "", ""]})
    html = plots.summary_tables(tab).data
    assert html.count("<table") == 3 and html.count("<details>") == 1
    first, second, folded = html.split("</table>")[:3]
    assert "softmax 0.99: 0.97 ✓, 0.81×" in first and "exit classifier, copy-forward" in first
    assert "self-distillation" not in first and "from scratch" not in first
    assert "not run" in second and "self-spec E=15 d=2: 1.00 ✓, 0.95×" in second
    assert "The from-scratch control models" in folded and "softmax 0.1: 1.00 ✓, 0.50×" in folded


def test_split_tables_one_per_model_with_readable_parts():
    html = ch08.split_tables(_splits(), {"released": "R", "trained": "T"}).data
    assert html.count("<table") == 2 and "R: loss, mean [95% CI]" in html and "exit decision alone" in html
    assert "exit_decision" not in html


def test_split_notes_table_and_cache_loss():
    sp = _splits()
    n = ch08.split_notes(sp, "sp", ["naive-mask"])
    assert set(n) == {f"sp_{m}_naive_mask_{p}" for m in ("released", "trained") for p in ("exit_decision", "cache", "total")}
    assert n["sp_released_naive_mask_total"] == pytest.approx(0.4)
    assert ch08.cache_loss(sp, "released", "naive-mask") == pytest.approx(0.2)
    assert math.isnan(ch08.cache_loss(sp[sp.model == "trained"], "released", "naive-mask"))
    t = ch08.split_table(sp, {"released": "R", "trained": "T"})
    assert list(t.columns) == ["model", "part", "lazy-recompute", "naive-mask"] and len(t) == 8
    assert t.iloc[0]["naive-mask"] == "0.20 [0.15, 0.25]"


def test_figures_draw():
    import matplotlib.pyplot as plt

    from earlyexit.experiments import compare

    summ = pd.DataFrame([{**_summ(k, m, f"{m} {t}", 1.0 + t, 1.0 - t / 2), "layers": 6 - t, "layers_lo": 5.5 - t,
                          "layers_hi": 6.5 - t, "consistency_lo": 0.9 - t / 2, "consistency_hi": 1.0}
                         for k in ("released", "trained") for m in compare.METHODS for t in (0.1, 0.3)])
    bounds = pd.DataFrame([{"model": "released", "method": "naive-mask", "speed": 1.5, "consistency": 0.8}])
    fig = ch08.pareto_figure(summ, bounds, ["released", "trained"], {"released": "R", "trained": "T"}, 0.95)
    assert len(fig.axes) == 6                       # a row per model, a column per family
    assert [ax.get_title() for ax in fig.axes[:3]] == list(ch08.PARETO_FAMILIES)
    assert fig.axes[0].get_ylabel().startswith("R") and fig.axes[3].get_ylabel().startswith("T")
    lo, hi = fig.axes[0].get_xlim()
    assert lo < 1.0 and 1.5 < hi < 2.0               # one speed scale for every panel: every point and bound fits
    import math
    ticks = [t for t in fig.axes[0].get_xticks() if lo <= t <= hi]
    assert min(math.log10(b / a) for a, b in zip(ticks, ticks[1:])) >= 0.12    # labels that do not collide
    legends = [ax.get_legend() for ax in fig.axes[:3]]
    assert all(legends) and [t.get_text() for t in legends[1].get_texts()] == list(compare.CLASSIFIER_CACHES)
    assert "cost-model bound" in [t.get_text() for t in legends[0].get_texts()]
    plt.close("all")
    fig = ch08.split_figure(_splits(), {"released": "R", "trained": "T"})
    assert len(fig.axes) == 2 and len(fig.axes[0].patches) == 6
    fig = ch08.ltt_figure(_det([True, False]), _res(), 1.0, 0.25, 0.1)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "0.9"]
    assert len(ch08.ltt_figure(_det([False]), None, None, 0.25, 0.1).axes) == 2
    plt.close("all")

"""Chapter 3's page, built from hand-made results: each sentence branch by branch, its tables and figures."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from earlyexit.chapters import ch03

HEAD = "Under oracle exits, where only the cache can hurt, copies"
INCL, EXCL = "an interval that includes zero", "an interval that excludes zero"


def test_copy_verdict_better_on_tokens_not_on_rouge():
    s = ch03.copy_verdict((2.08, 0.42, 4.0), (-0.073, -0.22, 0.05))
    assert s == (f"{HEAD} do better than the naive mask on tokens until the first divergence (+2.1 tokens, {EXCL}) "
                 f"but not on ROUGE-L (-0.07, {INCL}).")
    same = ch03.copy_verdict((2.08, 0.42, 4.0), (0.001, -0.01, 0.01))
    assert same.endswith("but not on ROUGE-L, which does not change.") and "+0.00" not in same


def test_copy_verdict_beat():
    s = ch03.copy_verdict((0.25, 0.0, 0.75), (0.03125, 0.0, 0.09375))
    assert s == (f"{HEAD} beat the naive mask: ROUGE-L +0.03 ({INCL}) and +0.2 tokens until the first divergence "
                 f"({INCL}).")
    same = ch03.copy_verdict((0.02, -0.5, 0.5), (0.1, 0.05, 0.2))
    assert same == (f"{HEAD} beat the naive mask: ROUGE-L +0.10 ({EXCL}) and the same number of tokens until the "
                    "first divergence.")


def test_copy_verdict_no_better():
    s = ch03.copy_verdict((-1.0, -2.0, -0.5), (-0.05, -0.1, 0.01))
    assert s == (f"{HEAD} do no better than the naive mask: ROUGE-L -0.05 ({INCL}), -1.0 tokens until the first "
                 f"divergence ({EXCL}).")
    s = ch03.copy_verdict((-1.0, -2.0, -0.5), (0.004, -0.1, 0.1))
    assert s.startswith(f"{HEAD} do no better than the naive mask: the same ROUGE-L, -1.0 tokens")


def test_copy_verdict_nothing_changes():
    assert ch03.copy_verdict((0.0, 0.0, 0.0), (-0.001, 0.0, 0.0)) == \
        f"{HEAD} change nothing against the naive mask: the same ROUGE-L and the same number of tokens until the " \
        "first divergence."


def test_op_rouge_sentence_each_branch():
    assert ch03.op_rouge_sentence(0.99, np.nan, np.nan, np.nan) == \
        "The operating threshold 0.99 of the confidence rule is not among the thresholds swept here."
    assert ch03.op_rouge_sentence(0.9, 0.0, 0.0, 0.0) == (
        "At the operating threshold 0.9 of the confidence rule the two caches give the same ROUGE-L: there the "
        "rule's own wrong exits dominate (chapter 2) and the choice of cache matters little.")
    assert "the same ROUGE-L on average (-0.02 to +0.02)" in ch03.op_rouge_sentence(0.9, 0.001, -0.02, 0.02)
    assert ch03.op_rouge_sentence(0.99, 0.0495, -0.013, 0.1146) == (
        "At the operating threshold 0.99 of the confidence rule the difference in ROUGE-L is +0.05 (-0.01 to "
        "+0.11): there the rule's own wrong exits dominate (chapter 2) and the choice of cache matters little.")
    assert ch03.op_rouge_sentence(0.99, 0.2, 0.1, 0.3).endswith(
        "is +0.20 (+0.10 to +0.30): even with the rule's own wrong exits (chapter 2) the choice of cache shows.")


def test_speed_verdict_slower_faster_and_no_different():
    def sp(r, lo, hi, v):
        return {"ratio": r, "lo": lo, "hi": hi, "verdict": v, "digits": 2}
    assert ch03.speed_verdict(sp(0.47, 0.44, 0.5, "slower")) == \
        "It is slower than not exiting at all: 0.47× [0.44, 0.50] the speed of full depth."
    assert ch03.speed_verdict(sp(1.3, 1.2, 1.4, "faster")).startswith("It is still faster than not exiting at all: 1.30×")
    assert ch03.speed_verdict(sp(1.01, 0.95, 1.08, "no different")) == (
        "It runs about as fast as not exiting at all: 1.01× [0.95, 1.08] the speed of full depth, an interval that "
        "holds 1.")
    assert ch03.speed_verdict(sp(0.46, float("nan"), float("nan"), "no different")) == \
        "It runs at 0.46× (one timed run, no interval) the speed of full depth."


def test_unrestricted_sentence_cost_and_worth():
    assert ch03.unrestricted_sentence(0.55, 2.153, 0.07, cheapest=True) == (
        "The unrestricted softmax rule is the cheapest in FLOPs (0.55) because it runs only 2.2 layers per token, "
        "and it is useless (ROUGE-L 0.07).")
    assert ch03.unrestricted_sentence(0.55, 2.153, 0.8, cheapest=True).endswith("token, for a ROUGE-L of 0.80.")
    assert ch03.unrestricted_sentence(5.62, 6.0, 1.0, cheapest=False) == (
        "The unrestricted softmax rule spends 5.62 times the full model's FLOPs at 6.0 layers per token, for a "
        "ROUGE-L of 1.00.")
    assert ch03.unrestricted_sentence(1.2, 3.0, 0.1, cheapest=False).endswith(
        "token, and it is useless (ROUGE-L 0.10).")


def _points():
    pts = pd.DataFrame({"strategy": ["naive-mask"] * 2 + ["copy-forward"] * 2, "prompt": [0, 1, 0, 1],
                        "threshold": [0.9] * 4, "rouge_full": [0.5, 0.6, 0.7, 0.6], "ttd": [3, 4, 5, 4],
                        "layers": [5.0, 5.0, 5.0, 5.0]})
    oracle = pts.assign(rouge_full=[0.8, 0.8, 0.8, 0.9], threshold=np.nan)
    return pts, oracle


def test_paired_differences_table_and_lookup():
    pts, oracle = _points()
    diff = ch03.paired_differences(pts, oracle, ["naive-mask", "copy-forward"], [0.9], n_boot=50, seed=0)
    assert set(diff.point) == {"0.9", "oracle"}
    assert ch03.paired(diff, "0.9", "rouge_full")[0] == pytest.approx(0.1)
    assert ch03.paired(diff, "oracle", "layers") == (0.0, 0.0, 0.0)
    assert all(math.isnan(v) for v in ch03.paired(diff, "0.99", "rouge_full"))
    t = ch03.difference_table(diff).data
    head = "copy-forward − naive-mask, per prompt: mean [95% CI]"
    assert list(t.columns) == [head, "ROUGE-L vs full", "tokens until the first difference", "layers / token"]
    t = t.set_index(head)
    assert list(t.index) == ["threshold 0.9", "oracle exits"]
    assert t.loc["threshold 0.9", "tokens until the first difference"].startswith("+1.00 [")
    assert t.loc["oracle exits", "layers / token"] == "+0.00 [+0.00, +0.00]"


def test_drift_and_decide_tables_say_n_a_where_a_cache_makes_no_copies():
    dr = pd.DataFrame({"strategy": ["copy-forward", "naive-mask", "copy-forward"], "exit": [30, 30, 12],
                       "kl": [0.01, 0.02, 3.0], "k_err_copied": [0.4, np.nan, 0.4], "v_err_copied": [0.5, np.nan, 0.5],
                       "k_err_computed": [0.01, 0.02, 0.01], "v_err_computed": [0.01, 0.02, 0.01]})
    t = ch03.drift_table(dr, 30)
    assert list(t.data["cache"]) == ["copy-forward", "naive-mask"]
    # the KL counts the full-depth steps only, as the text does (an exit step reads another layer's distribution)
    assert list(t.data["KL from full at full-depth steps (nats)"]) == ["0.01", "0.02"]
    html = t.to_html()
    assert "n/a" in html and ">nan<" not in html and "k_err" not in html
    q = pd.DataFrame({"layers": [30.0, 20.0], "head_checks": [1.0, 9.0], "flop_fraction": [1.0, 0.9],
                      "rouge_full": [1.0, 0.8]}, index=["full depth", "softmax"])
    ts = pd.DataFrame({"ratio": [1.0, 0.75], "lo": [0.96, 0.7], "hi": [1.04, 0.8], "verdict": ["no different", "slower"],
                       "digits": [2, 2]}, index=["full depth", "softmax"])
    d = ch03.decide_table(q, ts, ["full depth", "softmax"]).data
    assert list(d["how the exit is decided"]) == ["full depth", "softmax"] and list(d.index) == [0, 1]
    assert list(d["speed / full depth [95% CI]"]) == ["1.00× [0.96, 1.04]", "0.75× [0.70, 0.80]"]


def test_windows_and_error_series():
    dr = pd.DataFrame({"strategy": ["copy-forward"] * 4 + ["naive-mask"] * 4, "prompt": [0] * 8,
                       "t": [0, 1, 2, 3] * 2, "k_err_copied": [0.3] * 8, "k_err_computed": [0.01] * 8})
    w = ch03.windowed(dr, 16)                      # windows of 2 positions, centred on 2, 4, ...
    assert list(w[w.strategy == "naive-mask"]["window"]) == [2, 2, 4]
    e = ch03.error_windows(w)
    assert list(dict.fromkeys(e.entries)) == list(ch03.ERROR_SERIES)
    assert len(e) == 2 + 2 + 2


def test_decision_schemes_checks_and_names():
    P = SimpleNamespace(check_layers=[15, 20, 25], decide_threshold=0.9, saturation_threshold=0.99, clf_operating=0.8)
    checks, schemes = ch03.decision_schemes(P, 30, 15, "clf")
    assert checks == [15, 20, 25]
    assert list(schemes) == ["full depth", "softmax, every layer", "softmax, layers >= 15", "softmax at 15,20,25",
                             "saturation, layers >= 15", "exit classifier, layers >= 15"]
    checks, schemes = ch03.decision_schemes(P, 6, 3, "clf")
    assert checks == [3] and "softmax at 3" in schemes


def test_figures_draw():
    import matplotlib.pyplot as plt

    colors = ch03.colors(["naive-mask", "copy-forward"])
    assert list(colors) == ["naive-mask", "copy-forward", "lazy-recompute"]
    mass_s = pd.DataFrame({"strategy": ["naive-mask", "copy-forward"], "layer": [1, 1], "mean": [0.1, 0.2],
                           "lo": [0.0, 0.1], "hi": [0.2, 0.3]})
    kl_s = pd.DataFrame({"strategy": ch03.DRIFT, "window": [2] * 3, "mean": [0.1] * 3, "lo": [0.0] * 3,
                         "hi": [0.2] * 3})
    err_s = pd.DataFrame({"entries": list(ch03.ERROR_SERIES), "window": [2] * 3, "mean": [0.1] * 3, "lo": [0.05] * 3,
                          "hi": [0.2] * 3})
    for fig, keys in ((ch03.mass_figure(mass_s, colors), 1), (ch03.drift_figure(kl_s, err_s, colors), 2)):
        assert fig.axes and all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == keys
        plt.close(fig)


def test_copies_sentence_none_far_off_close():
    from earlyexit.chapters import ch03

    none = ch03.copies_sentence(float("nan"), float("nan"))
    assert "nothing was copied" in none and "nan" not in none
    far = ch03.copies_sentence(0.8, 0.6)
    assert "far from" in far and "0.80 for K, 0.60 for V): on this model a copy is a rough guess." in far
    assert "off from" in ch03.copies_sentence(0.1, 0.2) and ch03.copies_sentence(0.1, 0.2).endswith("for V).")
    assert "close to" in ch03.copies_sentence(0.01, 0.02)


def test_kl_trend_and_its_sentence_grow_shrink_flat_and_too_few():
    def klw(slopes, noise=0.0):
        rows = []
        for p, sl in enumerate(slopes):
            for k, w in enumerate((64, 192, 320, 448)):
                rows.append({"strategy": "copy-forward", "prompt": p, "window": w,
                             "kl": 0.1 + sl * w / 1000 + noise * (-1) ** (k + p)})
        return pd.DataFrame(rows)

    up = ch03.kl_trend(klw([0.5, 0.6, 0.55]), "copy-forward")
    assert up["n"] == 3 and up["lo"] > 0 and abs(up["slope"] - 0.55) < 1e-9
    assert ch03.trend_sentence(up, 512).startswith("Over 512 generated tokens the copies' KL grows with the position: +0.55")
    down = ch03.kl_trend(klw([-0.5, -0.6, -0.55]), "copy-forward")
    assert "shrinks" in ch03.trend_sentence(down, 512)
    flat = ch03.kl_trend(klw([0.2, -0.2, 0.01], noise=0.01), "copy-forward")
    assert flat["lo"] < 0 < flat["hi"] and "shows no trend" in ch03.trend_sentence(flat, 1024)
    one = ch03.kl_trend(klw([0.5]), "copy-forward")
    assert one["n"] == 1 and ch03.trend_sentence(one, 1024).startswith("Too few prompts")

"""Chapter 9's page, built from hand-made results: its tables, each sentence branch by branch, and its figures."""
from __future__ import annotations

import matplotlib
import numpy as np
import pandas as pd
import pytest

from earlyexit.chapters import ch09
from earlyexit.experiments import costmodel

matplotlib.use("Agg")
NAMES = {"released": "M", "trained": "M + LayerSkip"}


def make_units() -> pd.DataFrame:
    """A unit-cost table in the shape costmodel.measure_units returns (unit, size, seconds)."""
    rows = [("layer", k, 1e-3 * (1 + 0.05 * (k - 1))) for k in (1, 2, 4, 8, 16)]
    rows += [(u, r, s * (1 + 0.5 * (r - 1))) for u, s in (("head", 5e-4), ("head_short", 1e-4)) for r in (1, 2, 4)]
    rows += [("decide", 1, 2e-4), ("decide", 4, 5e-4), ("kv", 1, 1e-5), ("kv", 4, 3e-5), ("step", 1, 1e-4),
             ("check_classifier", 1, 5e-5), ("check_classifier", 4, 8e-5)]
    return pd.DataFrame(rows, columns=["unit", "size", "seconds"])


UNITS = make_units()
U = ch09.unit_costs(UNITS)


def test_unit_costs():
    assert U[("layer", 1)] == pytest.approx(1e-3) and U[("layer", 16)] == pytest.approx(1.75e-3)
    assert U[("check_classifier", 4)] == pytest.approx(8e-5)


def test_spec_decode_rate_takes_the_prompt_pass_out():
    sp = pd.DataFrame({"prompt": [0, 1], "n_new": [9, 9], "spec_s": [0.5, 1.0], "spec_prefill_s": [0.1, 0.2]})
    got = ch09.spec_decode_rate(sp)
    assert got.tolist() == pytest.approx([8 / 0.4, 8 / 0.8])       # n_new − 1 decoding steps over the decode time


def test_validation_notes_within_and_outside():
    val = pd.DataFrame({"source": ["a", "a", "b"], "method": ["x", "y", "z"], "rel_err": [0.05, -0.1, 0.3]})
    n = ch09.validation_notes(val, 0.15)
    assert n["n_val"] == 3 and n["val_median_pct"] == "10%" and n["val_worst_pct"] == "30%"
    assert n["val_worst_what"] == "z (b)" and n["val_verdict"] == "within"
    assert n["val_by_source"] == "a 8%; b 30%"
    assert ch09.validation_notes(val, 0.1)["val_verdict"] == "outside"


def calls(decode: dict, prefill: dict | None = None) -> str:
    return costmodel.calls_json({"decode": decode, **({"prefill": prefill} if prefill else {})})


def timed_frame() -> pd.DataFrame:
    full = calls({"layer:1": 8, "head:out:1": 2, "steps": 2}, {"layer:4": 4, "head:out:1": 1})
    rule = calls({"layer:1": 6, "head:decide:1": 4, "head:out:1": 2, "steps": 2})
    clf = calls({"layer:1": 6, "check:classifier:1": 4, "head:out:1": 2, "steps": 2})
    rows = []
    for m in ("released", "trained"):
        rows += [{"model": m, "method": "full depth", "prompt": p, "tok_s": 100.0 + p, "calls": full, "steps": 2}
                 for p in (0, 1)]
        rows += [{"model": m, "method": "softmax / lazy-recompute", "prompt": p, "tok_s": 90.0, "calls": rule,
                  "steps": 2} for p in (0, 1)]
        rows += [{"model": m, "method": "classifier / lazy-recompute", "prompt": 0, "tok_s": 120.0, "calls": clf,
                  "steps": 2}]
    return pd.DataFrame(rows)


def test_breakdown_table_is_the_decode_phase_per_step():
    bd = ch09.breakdown_table(timed_frame(), UNITS)
    assert list(bd["method"][:3]) == ["full depth", "softmax / lazy-recompute", "classifier / lazy-recompute"]
    full = bd.iloc[0]
    pred = costmodel.predict({"layer:1": 8, "head:out:1": 2, "steps": 2}, UNITS)   # the prompt pass left out
    for p in ch09.PARTS:
        assert full[p] == pytest.approx(pred[p] / 2)
    assert full["measured"] == pytest.approx(np.mean([1 / 100, 1 / 101]))
    rule, clf = bd.iloc[1], bd.iloc[2]
    assert rule["deciding"] > clf["deciding"] > 0 and full["deciding"] == 0


def op_frame(cons=(0.95, 0.8), speeds=(1.3, 1.5)) -> pd.DataFrame:
    return pd.DataFrame({"model": ["released", "trained"], "rule": ["classifier", "softmax"],
                         "label": ["classifier 0.8 / lazy-recompute", "softmax 0.9 / lazy-recompute"],
                         "rouge_full": list(cons), "speed": list(speeds), "layers": [20.0, 25.0]})


def test_operating_points_keep_the_classifier_at_its_threshold_and_divide_by_full_depth():
    sw = pd.DataFrame({"model": ["released"] * 3, "rule": ["classifier", "classifier", "softmax"],
                       "strategy": ["lazy-recompute"] * 3,
                       "label": ["classifier 0.5 / lazy-recompute", "classifier 0.8 / lazy-recompute",
                                 "softmax 0.9 / lazy-recompute"], "rouge_full": [0.7, 0.9, 0.95],
                       "layers": [10.0, 20.0, 25.0]})
    speed = timed_frame().groupby(["model", "method"])["tok_s"].mean()
    op = ch09.operating_points(sw, speed, 0.8)
    assert op["label"].tolist() == ["classifier 0.8 / lazy-recompute", "softmax 0.9 / lazy-recompute"]
    assert op["speed"].tolist() == pytest.approx([120 / 100.5, 90 / 100.5])


def test_operating_table():
    op = op_frame().assign(method=["classifier / lazy-recompute", "softmax / lazy-recompute"])
    for c in ("rouge_full", "layers"):
        op[c + "_lo"], op[c + "_hi"] = op[c] - 0.1, op[c] + 0.1
    t = ch09.operating_table(op, NAMES, lambda r, v, fmt="{:.2f}": fmt.format(r[v]))
    assert t["model"].tolist() == ["M", "M + LayerSkip"] and t["speed vs full (batch 1)"].tolist() == ["1.30", "1.50"]
    assert t["layers / token [95% CI]"].tolist() == ["20.0", "25.0"]


def test_pays_sentence_best_and_none():
    assert ch09.pays_sentence(op_frame(), 0.9, NAMES) == (
        "At batch one on this machine, the fastest token-level method that keeps a consistency of at least 0.9 is "
        "classifier 0.8 / lazy-recompute on M, at 1.30 times full depth (consistency 0.95).")
    assert ch09.best_consistent(op_frame(cons=(0.5, 0.8)), 0.9) is None
    assert ch09.pays_sentence(op_frame(cons=(0.5, 0.8)), 0.9, NAMES) == (
        "At batch one on this machine, no token-level method keeps a consistency of 0.9: the most consistent, "
        "softmax 0.9 / lazy-recompute on M + LayerSkip, keeps 0.80 at 1.50 times full depth.")


def test_ltt_lambda_and_sentence_none_one_many():
    assert ch09.ltt_lambda(None) == "no threshold" and ch09.ltt_lambda(0.9) == "λ = 0.9"
    assert ch09.ltt_sentence(0, None) == "The test accepts no threshold, so none is chosen."
    assert ch09.ltt_sentence(1, 1.0) == "The test accepts one threshold, λ = 1."
    assert ch09.ltt_sentence(3, 0.8) == "The test accepts 3 thresholds and chooses the lowest, λ = 0.8."


def test_ltt_result_none_within_above():
    assert ch09.ltt_result(None, 0.1) == "Nothing is left to test on the test half."
    res = pd.DataFrame([{"consistency": 0.95, "consistency_lo": 0.9, "consistency_hi": 0.99, "risk": 0.05,
                         "layers": 27.25}])
    assert ch09.ltt_result(res, 0.1) == ("On the test half it keeps a consistency of 0.95 (0.90 to 0.99), a loss of "
                                        "0.05 (within ε), at 27.2 layers per token.")
    assert "(above ε)" in ch09.ltt_result(res.assign(risk=0.2), 0.1)


def bounds_frame(oracle=(1.1, 1.3)) -> pd.DataFrame:
    return pd.DataFrame({"model": ["released", "trained"], "cache": ["lazy-recompute", "copy-forward"],
                         "measured": [0.8, 0.9], "predicted": [0.85, 0.95], "free decisions": [1.0, 1.05],
                         "oracle exits": list(oracle)})


def test_bounds_notes_reaches_and_stays_below():
    assert ch09.bounds_notes(bounds_frame(), NAMES, 1.2) == {"bound_best": "copy-forward on M + LayerSkip",
                                                             "bound_best_speed": 1.3, "bound_verdict": "reaches"}
    assert ch09.bounds_notes(bounds_frame((1.1, 1.15)), NAMES, 1.2)["bound_verdict"] == "stays below"


def fr(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["rule", "threshold", "prefix", "error_rate", "mean_exit", "speed",
                                       "speed_free"])


EXITS = ("softmax", 0.99, 0.95, 0.01, 20.5, 1.1, 1.3)       # consistent and exits
IDLE = ("saturation", 0.999, 0.97, 0.0, 23.95, 0.98, 1.0)  # consistent, hardly exits (L = 24)
WRONG = ("classifier", 0.5, 0.4, 0.2, 12.0, 1.8, 2.0)       # fast and inconsistent


def test_frontier_best_exiting_with_an_idle_rule():
    assert ch09.frontier_best(fr([EXITS, IDLE, WRONG]), 24, 0.9) == (
        "the fastest threshold that keeps an identical prefix of at least 0.9 and exits at all is softmax at 0.99: "
        "it is wrong on 1.0% of tokens, exits after 20.5 layers on average and runs at 1.10 times full depth (1.30 if "
        "its decisions were free). Saturation keeps it only at thresholds where it hardly ever exits (at 0.999: 23.95 "
        "layers on average, 0.98 times full depth: its checks cost time and save none).")


def test_frontier_best_exiting_alone():
    s = ch09.frontier_best(fr([EXITS, WRONG]), 24, 0.9)
    assert s.startswith("the fastest threshold that keeps") and s.endswith("(1.30 if its decisions were free).")


def test_frontier_best_only_idle():
    assert ch09.frontier_best(fr([IDLE, WRONG]), 24, 0.9) == (
        "only thresholds that hardly ever exit keep an identical prefix of 0.9: the fastest, saturation at 0.999, "
        "exits after 23.95 layers on average and runs at 0.98 times full depth.")


def test_frontier_best_none_consistent():
    assert ch09.frontier_best(fr([WRONG, ("softmax", 0.9, 0.6, 0.1, 18.0, 1.2, 1.4)]), 24, 0.9) == (
        "no threshold keeps an identical prefix of 0.9; the closest, softmax at 0.9, keeps 0.60, is wrong on 10.0% of "
        "tokens, exits after 18.0 layers on average and runs at 1.20 times full depth.")


def test_frontier_verdict_faster_not_faster_and_none():
    assert ch09.frontier_verdict(fr([EXITS, IDLE]), 0.9) == "faster"
    assert ch09.frontier_verdict(fr([IDLE, WRONG]), 0.9) == "not faster"
    assert ch09.frontier_verdict(fr([WRONG]), 0.9) == "not faster"


def test_frontier_notes():
    front = pd.concat([fr([EXITS, IDLE, WRONG]), fr([("oracle", np.nan, 1.0, 0.0, 15.0, 1.6, 1.6)])]) \
        .assign(model="trained")
    n = ch09.frontier_notes(front, "trained", 24, 0.9)
    assert (n["fr_oracle_exit"], n["fr_oracle_speed"]) == (15.0, 1.6)
    assert (n["fr_fast"], n["fr_fast_speed"], n["fr_fast_prefix"], n["fr_fast_err"]) == ("classifier at 0.5", 1.8,
                                                                                         0.4, 0.2)
    assert n["fr_verdict"] == "faster" and n["fr_best"].startswith("the fastest threshold")


def test_exit_needed():
    n = ch09.exit_needed({("layer", 1): 1.0, ("head", 1): 2.0, ("step", 1): 1.0}, 9, 1.2)   # full step: 12
    assert n == pytest.approx({"need_exit": 7.0, "head_share": 2 / 12, "ceiling_no_layers": 4.0})


@pytest.mark.parametrize("speed, how", [(1.3, "it meets"), (1.1, "faster than full depth, short of"),
                                        (0.9, "slower than full depth and short of")])
def test_verdict_meets_short_and_slower(speed, how):
    best = pd.Series({"label": "classifier 0.8 / lazy-recompute", "model": "trained", "speed": speed,
                      "rouge_full": 0.95})
    assert ch09.verdict(best, NAMES, 1.2, 0.9, "M + LayerSkip", 1.5) == (
        f"On this machine, at batch one, classifier 0.8 / lazy-recompute on M + LayerSkip decodes at {speed:.2f} times "
        f"full depth at consistency 0.95: {how} the 1.2× target.")


def test_verdict_none_consistent():
    assert ch09.verdict(None, NAMES, 1.2, 0.9, "M + LayerSkip", 1.5) == (
        "No token-level method keeps a consistency of 0.9 and beats full depth here: the exits that keep the token are "
        "there (oracle exits on M + LayerSkip: 1.50 times full depth), but no exit rule tells them from the wrong ones "
        "early enough.")


def test_figures_draw_from_small_tables():
    import matplotlib.pyplot as plt

    val = pd.DataFrame({"source": ["a", "b"], "method": ["x", "y"], "measured_s": [0.1, 0.2],
                        "predicted_s": [0.11, 0.18], "rel_err": [0.1, -0.1]})
    qual = pd.DataFrame({"model": "trained", "layer": [1, 2], "auc": [0.6, 0.7], "precision": [0.5, 0.6],
                         "positives": [0.3, 0.4]})
    front = pd.concat([fr([EXITS, IDLE, WRONG, ("classifier", 0.9, 0.9, 0.01, 22.0, 1.0, 1.1)]),
                       fr([("oracle", np.nan, 1.0, 0.0, 15.0, 1.6, 1.6)])]).assign(model="trained")
    figs = [ch09.unit_costs_figure(UNITS, 8192), ch09.validation_figure(val, 0.15),
            ch09.breakdown_figure(ch09.breakdown_table(timed_frame(), UNITS), NAMES),
            ch09.quality_figure(qual, NAMES, 0.8), ch09.bounds_figure(bounds_frame(), NAMES, 1.2),
            ch09.frontier_figure(front, NAMES, 0.9, 0.01)]
    assert [len(f.axes) for f in figs] == [2, 1, 2, 2, 2, 2]
    assert all(ax.get_legend() is None for ax in figs[3].axes) and len(figs[3].legends) == 2   # keys off the data
    for f in figs:
        plt.close(f)

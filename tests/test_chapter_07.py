"""Chapter 7's page (earlyexit.chapters.ch07): every sentence it builds from a result, branch by branch, on small
hand-made tables (no model)."""
import math

import pandas as pd
import pytest

from earlyexit.chapters import ch07

NAN = float("nan")


def test_one_significant_figure_in_words():
    assert [ch07.sig1(x) for x in (0.0734, 6.7, 46_875, 4_687_500, 1.23e9, 9.6e11, 1e12)] == \
        ["0.07", "7", "50,000", "5 million", "1 billion", "1 trillion", "1 trillion"]
    assert ch07.sig1(NAN) == "nan"


def test_lists_read_as_english():
    assert ch07._and([1]) == "1"
    assert ch07._and([1, 2]) == "1 and 2"
    assert ch07._and([1, 2, 3]) == "1, 2 and 3"


@pytest.mark.parametrize("x, goal, word", [(1.3, 1.3, "meets"), (1.5, 1.3, "meets"), (1.29, 1.3, "misses")])
def test_meets_or_misses(x, goal, word):
    assert ch07.meets(x, goal) == word


@pytest.mark.parametrize("speedup, lo, hi, verdict", [
    (0.8, 0.7, 0.9, "still leaves self-speculation slower than full depth"),
    (0.95, 0.85, 1.05, "leaves self-speculation no measurably faster than full depth"),
    (1.05, 0.98, 1.12, "leaves self-speculation no measurably faster than full depth"),
    (1.1, 1.02, 1.2, "gives a speed-up, but a modest one"),
    (1.49, 1.4, 1.6, "gives a speed-up, but a modest one"),
    (1.5, 1.4, 1.6, "gives the speed-up the method promises")])
def test_spec_verdict(speedup, lo, hi, verdict):
    assert ch07.spec_verdict(speedup, lo, hi) == verdict


@pytest.mark.parametrize("lo, hi, words", [(1.1, 1.4, "faster than full depth"),
                                           (0.9, 1.2, "not measurably different from full depth"),
                                           (0.7, 1.0, "not measurably different from full depth"),
                                           (0.6, 0.9, "slower than full depth")])
def test_versus_full_depth(lo, hi, words):
    assert ch07.versus_full(lo, hi) == words


def test_ceiling_reason_below_and_above_the_goal():
    below = ch07.ceil_reason((1.23, 15, 2))
    assert below.startswith("The reason is in the table's second column") and "1.23× full depth (at E = 15, d = 2)" in below
    above = ch07.ceil_reason((2.01, 2, 2))
    assert above.startswith("The table's second column is the ceiling") and "up to 2.01× full depth" in above


def _need(alphas):
    return pd.DataFrame([{"E": E, "d": d, "alpha": a} for (E, d), a in zip([(2, 1), (2, 2), (4, 1)], alphas)])


def test_need_sentence_lists_each_point_and_says_when_none_reaches_the_target():
    assert ch07.need_sentence(_need([0.75, NAN, 0.5])) == "0.75 at E = 2, d = 1; none at E = 2, d = 2; 0.50 at E = 4, d = 1"
    assert ch07.need_sentence(_need([NAN, 0.72, NAN]), 1.5) == \
        "for 1.5× it needs none at E = 2, d = 1; 0.72 at E = 2, d = 2; none at E = 4, d = 1"
    assert ch07.need_sentence(_need([NAN, NAN, NAN]), 1.5) == "no acceptance gives 1.5× at any of these depths and lengths"


def _ext(rows):
    """Rows of budget.extrapolate for one target: (recipe, E, d, alpha_needed, alpha_now, tokens_needed)."""
    return pd.DataFrame(rows, columns=["recipe", "E", "d", "alpha_needed", "alpha_now", "tokens_needed"])


T_MAX, TOK_STEP, S_STEP, CEIL = 40_960, 1024, 6.7, (1.23, 15, 2)


def _needed(rows):
    return ch07.training_needed(_ext(rows), T_MAX, TOK_STEP, S_STEP, CEIL)


def test_training_needed_when_already_reached():
    s = _needed([("layerskip", 15, 2, 0.75, 0.80, 1e4), ("distill", 15, 2, 0.75, 0.60, 1e6)])
    assert s == ("no more training than chapter 6's: after its 40,960 tokens LayerSkip (data) at E = 15, d = 2 "
                 "already accepts 0.80 of its drafts, where 0.75 is needed")


def test_training_needed_when_out_of_reach_at_any_acceptance():
    s = _needed([("layerskip", 15, 2, NAN, 0.3, NAN), ("layerskip", 20, 2, NAN, 0.4, NAN)])
    assert s.startswith("no amount of training: it is out of reach at any acceptance")
    assert "1.23× at best" in s and "(E = 15, d = 2)" in s


def test_training_needed_when_no_fitted_line_gets_there():
    s = _needed([("layerskip", 15, 2, 0.9, 0.3, NAN), ("layerskip", 20, 2, 0.8, 0.4, 5e13)])
    assert s.startswith("more training than the fits can say: no fitted line reaches it within 1 trillion tokens")
    assert "no useful extrapolation" in s


def test_training_needed_within_the_measured_range():
    s = _needed([("layerskip", 15, 2, 0.75, 0.70, 30_000.0)])
    assert s == ("about 30,000 training tokens by the fitted line for LayerSkip (data) at E = 15, d = 2, within the "
                 "40,960 chapter 6 trained on, although its last checkpoint still accepts only 0.70 where 0.75 is needed")


def test_training_needed_beyond_the_data_is_an_extrapolation_to_one_significant_figure():
    tokens = 1.234e9                       # 30,127 times the budget; 1,205,078 steps of 6.7 s = 93.4 days
    s = _needed([("layerskip", 15, 2, 0.75, 0.2, tokens), ("distill", 20, 4, 0.6, 0.1, 5e9)])
    assert s == ("about 1 billion training tokens for LayerSkip (data) at E = 15, d = 2, 30,000 times the 40,960 "
                 "chapter 6 trained on and some 90 days of training at this machine's 6.7 s a step: an extrapolation "
                 "beyond the measured range, which holds only if the fitted trend does")


def test_one_caveat_says_the_extrapolation_caveat_once_when_both_phrases_carry_it():
    far = _needed([("layerskip", 15, 2, 0.75, 0.2, 1.234e9)])
    farther = _needed([("layerskip", 20, 4, 0.9, 0.1, 3e11)])
    a, b = ch07.one_caveat(far, farther)
    assert "extrapolation" not in a and b.endswith(": both are extrapolations beyond the measured range, which hold "
                                                  "only if the fitted trends do")
    assert (a + b).count("extrapolation") == 1
    near = _needed([("layerskip", 15, 2, 0.75, 0.70, 30_000.0)])
    assert ch07.one_caveat(near, far) == (near, far) and ch07.one_caveat(far, near) == (far, near)


def _row(speed, lo, hi, **kw):
    return pd.Series({"speedup": speed, "speedup_lo": lo, "speedup_hi": hi, **kw})


def test_claims_faster_slower_or_not_measurably_different_and_the_target():
    need = pd.DataFrame([{"E": 2, "d": 1, "shortlist": True, "target": 1.5, "alpha": 0.9},
                         {"E": 2, "d": 2, "shortlist": True, "target": 1.5, "alpha": 0.72},
                         {"E": 2, "d": 2, "shortlist": False, "target": 1.5, "alpha": NAN}])
    c = ch07.claim_notes([(0.9, 1.05, "a", 0.95, 1.15, 0.8), (1.0, 1.03, "b", 0.97, 1.09, 0.7)], need, True)
    assert c["all_best_speed"] == 1.03        # the cost model's first, not the fastest measured point
    assert c["claim_speed"] == ("the drafter the cost model ranks first is “b”, measured at 1.03× full depth (95% "
                                "interval 0.97 to 1.09: not measurably different from full depth), short of the "
                                "1.5× target")
    assert c["claim_goal"] == "1.5× would take an acceptance of 0.72 (E = 2, d = 2, shortlist head)"
    c = ch07.claim_notes([(1.6, 1.6, "c", 1.55, 1.7, 0.9)], need, False)
    assert c["claim_speed"].endswith("(95% interval 1.55 to 1.70: faster than full depth), at or above the 1.5× "
                                     "target")     # the target met by all of the interval
    held = ch07.claim_notes([(1.6, 1.6, "c", 1.45, 1.7, 0.9)], need, False)["claim_speed"]
    assert held.endswith("faster than full depth), an interval that holds the 1.5× target")
    assert c["claim_goal"] == "no acceptance at all reaches 1.5× with a draft from layer E"
    assert "slower than full depth), short of" in ch07.claim_notes([(0.5, 0.5, "d", 0.4, 0.6, 0.5)], need, True)["claim_speed"]
    need.loc[2, "alpha"] = 0.8
    assert ch07.claim_notes([(0.5, 0.5, "d", 0.4, 0.6, 0.5)], need, False)["claim_goal"].endswith("full head)")


def _grid():
    return pd.DataFrame({"E": [2, 2, 4], "d": [1, 1, 1], "lossless": [True, True, True],
                         "hf_lossless": [True, False, True], "full_tok_s": [300.0, 310.0, 1.0],
                         "spec_tok_s": [160.0, 170.0, 1.0], "hf_tok_s": [80.0, 90.0, 1.0]})


def test_speed_notes_with_and_without_the_transformers_peer():
    best = _row(0.53, 0.43, 0.64, E=2, d=1, acceptance=0.08, layers=11.1, tokens_per_round=1.08, vs_hf=1.9,
                vs_hf_lo=1.7, vs_hf_hi=2.1)
    sp = pd.DataFrame({"vs_hf": [1.9, 1.3]})
    alone = ch07.speed_notes(best, _grid(), sp, None, 69.8)
    assert alone["speed_goal_verb"] == "misses" and alone["spec_verdict"] == "still leaves self-speculation slower than full depth"
    assert alone["hf_goal"] == "was not measured against" and math.isnan(alone["method_vs_hf"])
    assert (alone["best_E"], alone["best_d"], alone["n_lossless"], alone["n_runs"], alone["full_tps"]) == (2, 1, 3, 3, 305.0)
    eng = pd.DataFrame({"seconds": [1.0, 1.0], "full_s": [0.8, 1.0], "lossless": [True, True]})
    peer = ch07.speed_notes(best, _grid(), sp, eng, 69.8)
    assert peer["hf_goal"] == "meets" and peer["hf_lossless"] == 2 and peer["hf_gen_lossless"] == 2
    assert peer["engine_vs_hf"] == pytest.approx(1.125) and peer["method_vs_hf"] == pytest.approx(1.9 / 1.125)
    assert (peer["vs_hf_min"], peer["vs_hf_max"], peer["hf_tps"]) == (1.3, 1.9, 85.0)
    straddle = ch07.speed_notes(best.copy().replace({1.7: 1.2}), _grid(), sp, eng, 69.8)
    assert straddle["hf_goal"] == "neither clearly meets nor clearly misses"


def test_meets_a_goal_by_its_interval_when_it_has_one():
    assert ch07.meets(1.35, 1.3) == "meets" and ch07.meets(1.25, 1.3) == "misses"
    assert ch07.meets(1.35, 1.3, 1.31, 1.4) == "meets" and ch07.meets(1.25, 1.3, 1.2, 1.29) == "misses"
    assert ch07.meets(1.35, 1.3, 1.26, 1.44) == ch07.meets(1.24, 1.3, 1.15, 1.34) == (
        "neither clearly meets nor clearly misses")
    assert ch07.meets(1.35, 1.3, float("nan"), float("nan")) == "meets"


def _eco(ours_best_skip: bool):
    idx = pd.MultiIndex.from_tuples([(k, w) for k in ("early exit E = 4", "layers left out (2 of 6), d = 1")
                                     for w in ("ours", "economize")], names=["drafter", "who"])
    fast = [0.8, 0.5, 1.2 if ours_best_skip else 0.7, 0.4]
    p2 = pd.DataFrame({"speedup": fast, "speedup_lo": fast, "speedup_hi": fast, "acceptance": 0.1}, index=idx)
    lossless = pd.DataFrame({"sum": [2, 2, 2, 1], "size": [2, 2, 2, 2]}, index=idx)
    return p2, lossless, {k: None for k in idx.get_level_values(0).unique()}


def test_economize_notes_ran_with_and_without_the_same_drafter_note_and_did_not_run():
    p2, lossless, pairs = _eco(ours_best_skip=True)
    n = ch07.economize_notes(p2, lossless, pairs, "", _row(1.48, 0, 0), 2)
    assert n["eco_best"] == "early exit E = 4" and n["eco_ours_best"] == "layers left out (2 of 6), d = 1"
    assert (n["eco_lossless"], n["eco_n"], n["eco_ratio"]) == (3, 4, 1.2 / 0.5)
    assert n["eco_same_note"] == (" Timed on its own in the previous section, the same drafter ran at 1.48×, outside "
                                  "this timing's 95% interval (1.20 to 1.20): two timings of one configuration on 2 "
                                  "prompts differ by more than their intervals allow, so read these intervals as too "
                                  "narrow.")
    p2, lossless, pairs = _eco(ours_best_skip=False)
    assert ch07.economize_notes(p2, lossless, pairs, "", _row(1.48, 0, 0), 2)["eco_same_note"] == ""
    none = ch07.economize_notes(None, None, pairs, "ImportError: no economize", _row(1.48, 0, 0), 2)
    assert none["eco_runs"] == "did not run here (ImportError: no economize)" and none["eco_n"] == 0
    assert none["eco_best"] == "none" and math.isnan(none["eco_ratio"]) and none["eco_same_note"] == ""
    assert none["eco_sentence"].startswith("economize did not run here (ImportError") and "nan" not in none["eco_sentence"]
    assert n["eco_sentence"].startswith("economize runs here unchanged") and "2.40 times economize's best." in \
        n["eco_sentence"] and n["eco_sentence"].endswith("too narrow.")


def test_same_drafter_note_same_inside_and_outside_the_interval():
    head = " Timed on its own in the previous section, the same drafter ran at"
    assert ch07.same_drafter_note(_row(0.961, 0.83, 1.07), _row(0.958, 0.8, 1.1), 4) == (
        f"{head} 0.96×, inside this timing's 95% interval, as two timings of one configuration should be.")
    assert ch07.same_drafter_note(_row(0.96, 0.83, 1.07), _row(0.91, 0.8, 1.0), 4) == (
        f"{head} 0.91×, inside this timing's 95% interval, as two timings of one configuration should be.")
    far = ch07.same_drafter_note(_row(0.96, 0.93, 0.99), _row(0.86, 0.8, 0.9), 4)
    assert far.startswith(f"{head} 0.86×, outside this timing's 95% interval (0.93 to 0.99)")
    # inside one interval but not the other: the two do not agree, and the sentence says whose interval leaves out
    one_way = ch07.same_drafter_note(_row(0.96, 0.7, 1.2), _row(0.86, 0.85, 0.87), 4)
    assert "outside" in one_way
    assert one_way.startswith(f"{head} 0.86×, with a 95% interval (0.85 to 0.87) that has this timing's 0.96× outside it")


def test_economize_table_shows_the_error_when_it_did_not_run():
    p2, lossless, pairs = _eco(ours_best_skip=True)
    t = ch07.economize_table(p2, lossless, pairs).data
    assert list(t["decoder"]) == ["ours", "economize"] * 2 and list(t["lossless"]) == ["2/2", "2/2", "2/2", "1/2"]
    assert ch07.economize_table(None, None, pairs, "boom").data.iloc[0, 0] == "boom"


def test_tables_as_the_reader_sees_them():
    vs = pd.DataFrame({"speedup": [0.7, 1.03], "speedup_lo": [0.6, 0.97], "speedup_hi": [0.8, 1.09],
                       "acceptance": [0.083, 0.0], "tokens_per_round": [1.083, 1.0]}, index=["full head, d = 1", "short"])
    vr = pd.DataFrame({"variant": ["full head, d = 1", "full head, d = 1", "short", "short"],
                       "lossless": [True, True, True, False]})
    t = ch07.variants_table(vs, vr).data
    assert list(t["speed-up over full depth [95% CI]"]) == ["0.70 [0.60, 0.80]", "1.03 [0.97, 1.09]"]
    assert list(t["acceptance"]) == ["8%", "0%"] and list(t["lossless"]) == ["2/2", "1/2"]
    ss = pd.DataFrame({"model": ["released"], "n_skip": [2], "s0": [3], "d": [1], "agreement": [0.03],
                       "acceptance": [0.0], "need": [NAN], "speedup": [1.48], "speedup_lo": [0.41],
                       "speedup_hi": [2.54], "predicted": [0.77]})
    sk = pd.DataFrame({"model": ["released"] * 2, "n_skip": [2, 2], "d": [1, 1], "lossless": [True, False]})
    html = ch07.skip_table(ss, sk).data                        # one table a model, captioned with it
    assert html.count("<table") == 1 and ">released</caption>" in html and "2 from layer 3, d = 1" in html
    assert all(f">{v}</td>" in html for v in ("out of reach", "1.48 [0.41, 2.54]", "1/2"))


def _strategy_summary():
    rows = []
    for m in ch07.MODELS:
        for k in ("naive-mask", "copy-forward"):
            for rule, label, layers in (("softmax", f"softmax 0.99 {k}", 20.0), ("softmax", f"softmax 0.9 {k}", 15.0),
                                        ("oracle", f"oracle {k}", 12.0)):
                rows.append({"model": m, "rule": rule, "strategy": k, "label": label, "layers": layers,
                             "layers_lo": layers, "layers_hi": layers, "rouge_full": 0.5 if m == "released" else 0.8,
                             "rouge_full_lo": 0.4, "rouge_full_hi": 0.9})
    return pd.DataFrame(rows)


def test_the_strategies_table_reads_the_operating_point_and_the_oracle_per_model_and_cache():
    t = ch07.strategies_table(_strategy_summary(), ["naive-mask", "copy-forward"], "softmax", 0.99,
                              lambda k: f"softmax 0.99 {k}")
    assert list(t["model"]) == ["released", "released", "trained", "trained"]
    assert list(t["layers / token, softmax ≥ 0.99"]) == ["20.0"] * 4           # the 0.99 point, not the 0.9 one
    assert list(t["layers / token, oracle exits"]) == ["12.0"] * 4
    assert t["ROUGE-L, softmax ≥ 0.99"].iloc[2] == "0.80 [0.40, 0.90]"
    assert not t.isna().any().any() and "index" not in t.columns
    with pytest.raises(ValueError, match="no softmax point at 0.5"):
        ch07.strategies_table(_strategy_summary(), ["naive-mask"], "softmax", 0.5, lambda k: f"softmax 0.5 {k}")


def test_candidates_rank_drafters_by_the_cost_model_from_the_calls_each_run_made():
    from test_costmodel import units_by_hand

    full = '{"decode":{"layer:1":12,"head:full:1":2,"steps":2}}'          # 2 steps of 6 layers: 2·(6·2 + 10 + 3)
    cheap = '{"decode":{"layer:1":6,"head:full:1":1,"steps":1}}'         # half of full depth's work: 2×
    dear = '{"decode":{"layer:1":12,"head:full:1":2,"steps":2,"kv:1":5}}'  # full depth's work and K/V copies
    runs = pd.DataFrame({"E": [2, 2, 4, 4], "d": [1, 1, 1, 1], "spec_calls": [cheap, cheap, dear, dear],
                         "full_calls": [full] * 4})
    summ = pd.DataFrame({"E": [2, 4], "d": [1, 1], "speedup": [0.9, 1.1], "speedup_lo": [0.8, 1.0],
                         "speedup_hi": [1.0, 1.2], "acceptance": [0.5, 0.9]})
    c = ch07.candidates((summ.assign(predicted=ch07.predicted(units_by_hand(), runs, summ, ["E", "d"])),
                         lambda r: f"E = {int(r.E)}"))
    assert [x[2] for x in c] == ["E = 2", "E = 4"]
    assert c[0][0] == pytest.approx(2.0) and c[1][0] < 1.0 and c[1][1] == 1.1 and c[1][5] == 0.9
    assert "“E = 2”, measured at 0.90×" in ch07.claim_notes(c, pd.DataFrame({"shortlist": [True], "target": [1.5],
                                                                               "alpha": [NAN], "E": [2], "d": [1]}),
                                                            True)["claim_speed"]
    # the prediction a chapter ranks a family by is the one the headline ranks every drafter by
    assert ch07.predicted(units_by_hand(), runs, summ, ["E", "d"]) == [x[0] for x in c]


def test_the_drafter_named_is_the_most_accepted_of_those_the_cost_model_cannot_tell_apart():
    # (predicted, measured, name, lo, hi, acceptance): b and c lie within 5% of the fastest prediction
    cands = [(0.80, 0.9, "a", 0.8, 1.0, 0.99), (0.96, 0.9, "b", 0.8, 1.0, 0.72), (0.92, 0.9, "c", 0.8, 1.0, 0.91)]
    assert ch07.first_candidate(cands)[2] == "c"
    # the same drafter when this build's unit costs put c ahead of b, and when they put b further ahead
    assert ch07.first_candidate([cands[0], (0.90, 0.9, "b", 0.8, 1.0, 0.72), (0.93, 0.9, "c", 0.8, 1.0, 0.91)])[2] == "c"
    # a prediction outside the band is not named, however often it is accepted
    assert ch07.first_candidate([cands[0], (1.00, 0.9, "b", 0.8, 1.0, 0.72), (0.94, 0.9, "c", 0.8, 1.0, 0.91)])[2] == "b"
    assert ch07.first_candidate([cands[1]])[2] == "b"
    with pytest.raises(ValueError, match="no drafter configuration to rank"):
        ch07.first_candidate([])


def test_break_even_reached_or_out_of_reach():
    assert ch07.break_even_sentence(0.8, 0.45, (25, 2)) == ("the best depth breaks even only at an acceptance of "
                                                             "0.80, where the training of chapter 6 reached 0.45")
    s = ch07.break_even_sentence(NAN, 0.45, (25, 2))
    assert s.startswith("no acceptance lets a draft from the best depth (E = 25, d = 2) break even") and "nan" not in s


def test_budget_table_states_both_levels_and_out_of_reach():
    from test_chapter_09 import make_units
    rows = []
    for E, d, a1, a15 in ((2, 2, 0.6, 0.9), (3, 1, 0.8, math.nan)):
        for target, a in ((1.0, a1), (ch07.SPEED_GOAL, a15)):
            rows.append({"E": E, "d": d, "shortlist": False, "target": target, "alpha_needed": a,
                         "recipe": "layerskip", "alpha_now": 0.4, "tokens_needed": 1e7 if target == 1.0 else 1e9})
    t = ch07.budget_table(pd.DataFrame(rows), make_units(), 4, ["layerskip"], False).data
    assert list(t["draft"]) == ["E = 2, d = 2", "E = 3, d = 1"]
    assert list(t["acceptance needed for 1.0x"]) == ["0.60", "0.80"]
    assert list(t[f"acceptance needed for {ch07.SPEED_GOAL:g}x"]) == ["0.90", "out of reach"]
    assert t.filter(like="now, tokens for 1.0x").iloc[0, 0] == "0.40, 1e+07"

"""A speed a page quotes is timed again by the paired protocol, whatever grid chose it; the same configuration on
the same prompts reads the same cached entry in every chapter that quotes it."""
import math

import pandas as pd
import pytest

from earlyexit.chapters import ch07, ch08, quoted
from earlyexit.engine import DecodeConfig
from earlyexit.engine.models import load_model
from earlyexit.experiments import evalset


def test_a_quoted_drafter_is_timed_paired_and_read_back_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr("earlyexit.paths.CACHE", tmp_path)
    lm = load_model("tiny-llama")
    es = evalset.eval_set(lm, "mix", 3, 0, 64)
    cfg = DecodeConfig.self_speculation(2, 2)
    s = quoted.paired(lm, es, 6, cfg, rounds=2)
    assert (s["groups"], s["rounds"]) == (3, 2)
    assert s["lo"] <= s["ratio"] <= s["hi"] and s["verdict"] in ("faster", "slower", "no different")
    # another chapter asking for the same configuration reads the same entry, not a new timing
    assert quoted.paired(lm, es, 6, DecodeConfig.self_speculation(2, 2), rounds=2) == s
    assert quoted.paired(lm, es, 6, cfg, rounds=1)["rounds"] == 1      # other rounds: another entry


def test_first_ranked_names_the_most_accepted_within_the_band_of_the_fastest_prediction():
    rows = pd.DataFrame({"predicted": [0.91, 0.89, 0.90, 0.90, 0.86], "acceptance": [0.91, 0.86, 0.87, 0.78, 0.75]},
                        index=["4 out, d = 1", "4 out, d = 2", "8 out, d = 1", "8 out, d = 2", "12 out, d = 1"])
    assert quoted.first_ranked(rows) == "4 out, d = 1"
    # another build's unit costs put "8 out, d = 2" first by 4%: the name stays
    moved = rows.assign(predicted=[0.92, 0.94, 0.90, 0.96, 0.86])
    assert moved["predicted"].idxmax() == "8 out, d = 2" and quoted.first_ranked(moved) == "4 out, d = 1"
    assert quoted.first_ranked(moved, tol=0.0) == "8 out, d = 2"           # no band: the plain maximum
    # outside the band acceptance does not count; a missing acceptance ranks last; ties: the earliest row
    assert quoted.first_ranked(rows.assign(predicted=[0.80, 0.89, 0.90, 0.90, 0.86])) == "8 out, d = 1"
    assert quoted.first_ranked(rows.assign(acceptance=[math.nan, 0.5, 0.5, 0.4, 0.9])) == "4 out, d = 2"
    assert quoted.first_ranked(pd.DataFrame({"speed": [1.0, -2.0], "acceptance": [0.5, 0.9]}), pred="speed") == 0
    with pytest.raises(ValueError, match="needs the columns 'predicted' and 'acceptance'; missing \\['acceptance'\\]"):
        quoted.first_ranked(rows[["predicted"]])
    with pytest.raises(ValueError, match="no configuration with a finite 'predicted'"):
        quoted.first_ranked(rows.assign(predicted=math.nan))
    with pytest.raises(ValueError, match=r"tol is a relative band in \[0, 1\), got 1.5"):
        quoted.first_ranked(rows, tol=1.5)


def test_chapter_8_names_per_model_the_drafter_chapter_7_names():
    summ = pd.DataFrame({"model": ["trained", "trained", "trained"], "label": ["E=4 d=2", "a", "b"],
                         "method": ["self-speculation", "full depth", "self-speculation"],
                         "speed": [0.90, 2.0, 0.60], "consistency": [1.0, 0.9, 1.0]})
    dsumm = pd.DataFrame({"model": ["trained", "released"], "method": ["layer-skip drafter"] * 2,
                          "label": ["skip 8", "skip 4"], "speed": [0.93, 0.88], "consistency": [1.0, 1.0]})
    runs = pd.DataFrame({"model": ["trained"] * 4 + ["released"], "label": ["E=4 d=2"] * 2 + ["skip 8"] * 2 + ["skip 4"],
                         "method": ["self-speculation"] * 2 + ["layer-skip drafter"] * 3,
                         "acceptance": [0.9, 0.8, 0.7, 0.7, 0.5]})
    named = quoted.named_drafters(summ, dsumm, runs)
    # 0.90 lies within 5% of 0.93 and is accepted more often (0.85 against 0.7); a lossy method never counts
    assert named.loc["trained", "label"] == "E=4 d=2" and named.loc["trained", "acceptance"] == pytest.approx(0.85)
    assert named.loc["released", "label"] == "skip 4" and list(named.index) == ["trained", "released"]
    assert quoted.named_drafters(summ.assign(consistency=0.5), dsumm.iloc[:0], runs).empty
    with pytest.raises(ValueError, match="needs the acceptance of each run"):
        quoted.named_drafters(summ, dsumm, runs.drop(columns="acceptance"))


def test_cited_replaces_the_speed_and_keeps_the_rest_of_the_row():
    row = pd.Series({"speedup": 0.9, "speedup_lo": 0.8, "speedup_hi": 1.0, "acceptance": 0.7, "predicted": 0.95})
    c = quoted.cited(row, {"ratio": 0.96, "lo": 0.92, "hi": 1.003})
    assert (c["speedup"], c["speedup_lo"], c["speedup_hi"], c["acceptance"]) == (0.96, 0.92, 1.003, 0.7)
    assert row["speedup"] == 0.9, "the grid's row is left as the grid measured it"
    v = quoted.cited(pd.Series({"vs_hf": 1.2}), {"ratio": 1.3, "lo": 1.1, "hi": 1.5}, prefix="vs_hf")
    assert (v["vs_hf"], v["vs_hf_lo"], v["vs_hf_hi"]) == (1.3, 1.1, 1.5)


def test_protocol_note_counts_in_words_and_refuses_nothing_timed():
    n = quoted.protocol_note(6, 3, 4)
    assert "on 6 prompts" in n and "for 3 rounds" in n and n.endswith("4 prompts, one run each")
    one = quoted.protocol_note(1, 1, 1, 2)
    assert "on 1 prompt," in one and "for 1 round," in one and one.endswith("1 prompt, the fastest of 2 runs each")
    with pytest.raises(ValueError, match="must each be >= 1, got 0, 3, 4, 1"):
        quoted.protocol_note(0, 3, 4)
    assert "its 95% interval is the t-interval over prompts." in n
    spread = quoted.protocol_note(6, 3, 4, run_sd=0.003)
    assert "a run-to-run spread of 0.3% (one standard deviation of one ratio between timing runs" in spread


def test_the_claim_is_the_cost_models_first_timed_paired():
    asked = []

    def cite(model, cfg):
        asked.append((model, cfg))
        return {"ratio": 0.97, "lo": 0.93, "hi": 1.01}

    cands = [(0.9, 1.2, "a", 1.1, 1.3, 0.9, ("trained", "cfg-a")), (1.0, 0.8, "b", 0.7, 0.9, 0.8, ("released", "cfg-b"))]
    claim = ch07.cite_claim(cands, cite)
    assert asked == [("released", "cfg-b")], "only the drafter the cost model ranks first is re-timed"
    assert claim == [(1.0, 0.97, "b", 0.93, 1.01, 0.8)]
    need = pd.DataFrame({"shortlist": [True], "target": [1.5], "alpha": [math.nan], "E": [2], "d": [1]})
    assert "“b”, measured at 0.97× full depth (95% interval 0.93 to 1.01: not measurably different" in \
        ch07.claim_notes(claim, need, True)["claim_speed"]


def test_skip_notes_quote_the_paired_speed_of_each_models_best_ranked_drafter():
    from test_costmodel import units_by_hand

    searches = {"released": pd.DataFrame({"n_skip": [1, 2], "agreement": [0.9, 0.8], "skip": ["3", "3 4"]})}
    sets = {"released": {1: (3,), 2: (3, 4)}, "trained": {1: (3,), 2: (3, 4)}}
    ss = pd.DataFrame({"model": ["released", "released", "trained"], "n_skip": [1, 2, 1], "d": [1, 1, 1],
                       "s0": [3, 3, 3], "speedup": [0.8, 0.9, 0.85], "speedup_lo": [0.7, 0.8, 0.8],
                       "speedup_hi": [0.9, 1.0, 0.9], "acceptance": [0.8, 0.7, 0.9], "need": [0.5, 0.5, 0.5],
                       "predicted": [0.95, 0.9, 0.97]})
    sk = pd.DataFrame({"lossless": [True, True, True]})
    cited = {"released": quoted.cited(ss.iloc[0], {"ratio": 1.01, "lo": 0.98, "hi": 1.04}),
             "trained": quoted.cited(ss.iloc[2], {"ratio": 0.93, "lo": 0.9, "hi": 0.96})}
    n = ch07.skip_notes(searches, sets, ss, sk, [1, 2], [1], units_by_hand(), 6, 0, cited)
    assert (n["skip_best_model"], n["skip_best_speed"], n["skip_best_lo"], n["skip_best_hi"]) == ("trained", 0.93, 0.9, 0.96)
    assert n["skip_verdict"] == "slower than full depth"
    assert (n["skip_lo_str"], n["skip_hi_str"], n["skip_best_n_str"]) == ("1 layer", "2 layers", "1 layer")
    assert (n["skip_released_best_speed"], n["skip_trained_best_speed"]) == (1.01, 0.93)
    grid = ch07.skip_notes(searches, sets, ss, sk, [1, 2], [1], units_by_hand(), 6, 0)   # without: the grid's
    assert (grid["skip_best_speed"], grid["skip_verdict"]) == (0.85, "slower than full depth")


def test_chapter_8_quotes_chapter_7s_paired_timing_of_the_same_drafter():
    summ = pd.DataFrame([{"model": "released", "method": "self-speculation", "label": "E=4 d=2", "speed": 0.6,
                          "speed_lo": 0.5, "speed_hi": 0.7, "consistency": 1.0}])
    dsumm = pd.DataFrame([{"model": "trained", "method": "layer-skip drafter", "label": "skip 2", "speed": 0.97,
                           "speed_lo": 0.9, "speed_hi": 1.0, "consistency": 1.0}])
    dpts = pd.DataFrame({"exact_match": [1.0, 1.0], "model": ["trained", "trained"],
                         "method": ["layer-skip drafter"] * 2, "label": ["skip 2"] * 2, "measured": [0.8, 1.0],
                         "config": ["cfg-skip-2"] * 2, "acceptance": [0.8, 0.9]})
    asked = []
    n = ch08.drafter_notes(summ, dsumm, dpts, {"trained": None},
                           cite=lambda k, cfg: asked.append((k, cfg)) or {"ratio": 0.93, "lo": 0.9, "hi": 0.96})
    assert asked == [("trained", "cfg-skip-2")]
    assert (n["draft_best_speed_trained"], n["draft_best_speed_lo_trained"], n["draft_best_speed_hi_trained"]) == \
        (0.93, 0.9, 0.96)

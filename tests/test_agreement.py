"""Two builds' paired ratios: read from the glued "r× [lo, hi]" strings, agreement within the intervals, and a
changed verdict found."""
import json
import math

import pytest

from earlyexit.book import agreement


def _nb(path, values: dict):
    outs = [{"output_type": "display_data", "metadata": {"scrapbook": {"name": k, "mime_prefix": ""}},
             "data": {"text/plain": repr(v) if isinstance(v, str) else str(v)}} for k, v in values.items()]
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "", "outputs": outs}]}))


def test_agreement_and_verdicts(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    _nb(a / "04_x.ipynb", {"speed_lazy": "0.93× [0.88, 0.98]", "speed_full": "1.00× [0.97, 1.03]",
                           "speed_rule": "0.45× [0.40, 0.50]", "n": 3, "only_a": "1.1× [1.0, 1.2]"})
    _nb(b / "04_x.ipynb", {"speed_lazy": "0.97× [0.92, 1.02]", "speed_full": "1.01× [0.98, 1.04]",
                           "speed_rule": "0.60× [0.55, 0.65]", "n": 3})
    t = agreement.compare(a, b).set_index("key")
    assert list(t.index) == ["speed_full", "speed_lazy", "speed_rule"]       # only ratios glued in both
    assert t.loc["speed_full", "agree"] and t.loc["speed_full", "same_verdict"]
    assert t.loc["speed_lazy", "agree"] and not t.loc["speed_lazy", "same_verdict"]   # slower, then no different
    assert not t.loc["speed_rule", "agree"] and t.loc["speed_rule", "same_verdict"]
    assert t.loc["speed_full", "consistent"] and t.loc["speed_lazy", "consistent"]
    assert not t.loc["speed_rule", "consistent"]
    assert agreement.summary(t) == ("3 paired ratios in both builds; 1 disagree (one build's ratio outside the "
                                    "other's interval); 1 differ by more than the difference's 95% interval; "
                                    "1 change verdict")
    assert agreement.main([str(a), str(b)]) == 0 and agreement.main([]) == 2


def test_consistent_is_the_difference_within_its_own_interval():
    # equal intervals of half-width h (log space): the difference may reach sqrt(2) h, not h
    assert agreement.consistent((1.00, 0.98, 1.02), (1.025, 1.005, 1.046))      # outside each other's, consistent
    assert not agreement.agree((1.00, 0.98, 1.02), (1.025, 1.005, 1.046))
    assert not agreement.consistent((1.00, 0.98, 1.02), (1.04, 1.02, 1.06))
    assert not agreement.consistent((1.0, float("nan"), float("nan")), (1.0, 0.9, 1.1))


def test_numbers_glued_with_their_interval_count_when_they_are_speeds(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    _nb(a / "07_x.ipynb", {"best_speedup": 1.02, "best_speedup_lo": 0.95, "best_speedup_hi": 1.1,
                           "skip_best_speed": 0.9, "skip_best_lo": 0.8, "skip_best_hi": 1.0,
                           "mass_top": 0.3, "mass_top_lo": 0.2, "mass_top_hi": 0.4,         # not a speed
                           "gone_speed": float("nan"), "gone_speed_lo": 1.0, "gone_speed_hi": 2.0})
    assert agreement.ratios(a) == {("07_x", "best_speedup"): (1.02, 0.95, 1.1),
                                   ("07_x", "skip_best_speed"): (0.9, 0.8, 1.0)}


def test_a_chapter_still_executing_is_not_a_page(tmp_path):
    _nb(tmp_path / "04_x.ipynb", {"speed_lazy": "0.93× [0.88, 0.98]"})
    _nb(tmp_path / ".04_x.running.ipynb", {"speed_lazy": "0.99× [0.90, 1.08]"})
    assert agreement.ratios(tmp_path) == {("04_x", "speed_lazy"): (0.93, 0.88, 0.98)}


def test_clear_timed_keeps_the_untimed_entries_and_moves_the_timed_aside(tmp_path):
    store = tmp_path / "cache"
    for kind in ("timing", "cost_units_paths", "point", "drift"):
        (store / kind).mkdir(parents=True)
        (store / kind / "e.json").write_text("{}")
    (store / "timing" / "e.claim").write_text("{}")                      # a live claim stays where it is
    assert agreement.clear_timed(root=store) == 2
    assert sorted(p.parent.name for p in store.glob("*/*.json")) == ["drift", "point"]
    kept = list((tmp_path / "cleared-timings").glob("*/*/e.json"))
    assert sorted(p.parent.name for p in kept) == ["cost_units_paths", "timing"], "moved aside, not deleted"
    assert (store / "timing" / "e.claim").exists()
    (store / "timing" / "f.json").write_text("{}")
    assert agreement.clear_timed(root=store, keep=False) == 1 and not (store / "timing" / "f.json").exists()


def test_every_timed_kind_is_one_the_package_stores():
    """A renamed or new timed entry that the list misses would survive the clearing and make the second run
    read the first run's clock."""
    import re
    from earlyexit import paths
    src = "".join(p.read_text() for p in (paths.REPO_ROOT / "src" / "earlyexit").rglob("*.py"))
    stored = set(re.findall(r'cached\(\s*"([a-z_]+)"', src))
    assert set(agreement.TIMED) <= stored, set(agreement.TIMED) - stored
    clocked = {k for k in stored if re.search(r"tim|units|spec|side_by_side", k)}
    assert clocked <= set(agreement.TIMED), clocked - set(agreement.TIMED)


def test_a_sentence_that_changes_its_words_is_found_and_one_that_changes_numbers_is_not(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    _nb(a / "04_x.ipynb", {"lazy_eager_sentence": "Batching the recompute pays: lazy at 1.1× [1.001, 1.2] eager's.",
                           "exit_str": "the mean exit stays at 24.1 layers", "n": 3, "speed_lazy": "1.1× [1.0, 1.2]",
                           "fig_cite": "Files: figures/a.pdf"})
    _nb(b / "04_x.ipynb", {"lazy_eager_sentence": "Lazy and eager are indistinguishable (1.1× [1.0, 1.2]).",
                           "exit_str": "the mean exit stays at 23.9 layers", "n": 4, "speed_lazy": "1.2× [1.1, 1.3]",
                           "fig_cite": "Files: figures/b.pdf"})
    w = agreement.wording(a, b)
    assert list(w["key"]) == ["lazy_eager_sentence"]
    assert w.loc[0, "a"].startswith("Batching") and w.loc[0, "b"].startswith("Lazy")
    assert agreement.wording(a, a).empty


def test_the_odds_of_a_changed_verdict_grow_as_a_bound_nears_one():
    far = agreement.change_odds((1.30, 1.25, 1.35), (1.31, 1.26, 1.36), 0.012)
    wide = agreement.change_odds((1.00, 0.80, 1.25), (1.01, 0.81, 1.26), 0.012)
    r = 1.1 ** 0.5                                                            # intervals are symmetric in logs
    edge = agreement.change_odds((r, 1.00, 1.10), (r, 1.00, 1.10), 0.012)
    assert far < 1e-6 and wide < 1e-6
    # the lower bound at 1.0 exactly: each run calls it faster half the time, so two runs differ half the time
    assert abs(edge - 0.5) < 1e-9
    slower = agreement.change_odds((1 / r, 1 / 1.10, 1.0), (1 / r, 1 / 1.10, 1.0), 0.012)
    assert abs(slower - edge) < 1e-9                                          # the same on the slow side
    assert 0 < agreement.change_odds((1.05, 1.01, 1.09), (1.05, 1.01, 1.09), 0.012) < edge
    assert math.isnan(agreement.change_odds((1.0, float("nan"), 1.1), (1.0, 0.9, 1.1), 0.012))  # no interval
    assert math.isnan(agreement.change_odds((1.05, 1.0, 1.1), (1.05, 1.0, 1.1), 0.0))  # no spread: NaN, not a guess


def test_the_summary_states_the_changes_two_runs_should_expect(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    _nb(a / "03_x.ipynb", {"speed_x": "1.05× [1.00, 1.10]", "speed_y": "1.30× [1.25, 1.35]"})
    _nb(b / "03_x.ipynb", {"speed_x": "1.05× [1.00, 1.10]", "speed_y": "1.30× [1.25, 1.35]"})
    t = agreement.compare(a, b)
    assert agreement.summary(t).endswith("0 change verdict")
    assert agreement.summary(t, 0.012).endswith(
        "0 change verdict, where a run-to-run spread of 0.012 expects 0.5 (1 ratio with a bound so near 1.0 that "
        "two runs differ at least 1 time in 5)")


def test_the_expectation_uses_the_spread_the_builds_recorded(tmp_path):
    """The summary's expected count used the parameter's default whatever the compared builds were built with."""
    def page(folder, sd):
        folder.mkdir(exist_ok=True)
        meta = {"earlyexit": {"notebook": "03_x", "parameters": {"model": "x", "timing_run_sd": sd, "threads": 1}}}
        (folder / "03_x.ipynb").write_text(json.dumps({"cells": [], "metadata": meta}))
    a, b, c, d = (tmp_path / n for n in "abcd")
    page(a, 0.007), page(b, 0.007), page(c, 0.012)
    d.mkdir()
    assert agreement.recorded_run_sd(a, b) == 0.007
    assert agreement.recorded_run_sd(d) == agreement.COMMON["timing_run_sd"].default, "nothing recorded"
    with pytest.raises(ValueError, match=r"different run-to-run spreads \(timing_run_sd \[0.007, 0.012\]\)"):
        agreement.recorded_run_sd(a, c)

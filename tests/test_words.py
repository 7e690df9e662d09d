"""The words for a measured speed: a ratio printed to the decimals its interval supports, and a verdict that
says faster or slower only when the interval excludes 1.0 (each branch)."""
import math

import pytest

from earlyexit.chapters import words


def _s(r, lo, hi, verdict, digits=2):
    return {"ratio": r, "lo": lo, "hi": hi, "verdict": verdict, "digits": digits}


def test_ratio_prints_the_interval_at_its_digits():
    assert words.ratio(_s(0.9312, 0.881, 0.984, "slower")) == "0.93× [0.88, 0.98]"
    assert words.ratio(_s(1.0, 0.6, 1.4, "no different", digits=1)) == "1.0× [0.6, 1.4]"
    assert words.ratio(_s(1.2346, 1.2301, 1.2389, "faster", digits=3)) == "1.235× [1.230, 1.239]"


def test_a_bound_that_would_print_as_one_gets_the_decimals_its_verdict_needs():
    assert words.ratio(_s(1.10, 1.004, 1.20, "faster", digits=1)) == "1.1× [1.004, 1.2]"
    assert words.ratio(_s(0.95, 0.90, 0.9996, "slower")) == "0.95× [0.90, 0.9996]"
    assert words.ratio(_s(1.05, 0.996, 1.10, "no different")) == "1.05× [1.00, 1.10]", "1.0 is in the interval"
    assert words.ratio(_s(1.13, 1.04, 1.24, "faster", digits=1)) == "1.1× [1.04, 1.2]"
    assert words.ratio(_s(1.5, 1.2, 1.8, "faster", digits=1)) == "1.5× [1.2, 1.8]", "no extra decimals needed"


def test_one_run_prints_no_interval_and_gives_no_verdict():
    one = _s(1.0712, math.nan, math.nan, "no different", digits=3)
    assert words.ratio(one) == "1.07× (one timed run, no interval)" and not words.has_interval(one)
    assert words.versus(one) == "one timed run, not compared with full depth"
    assert words.sentence("X", one).endswith(": no verdict.")


def test_each_verdict():
    assert words.versus(_s(1.3, 1.2, 1.4, "faster")) == "faster than full depth"
    assert words.versus(_s(0.7, 0.6, 0.8, "slower"), ref="HF generate") == "slower than HF generate"
    assert words.versus(_s(1.02, 0.97, 1.07, "no different")) == "not measurably different from full depth"
    assert words.sentence("SkipDecode", _s(1.02, 0.97, 1.07, "no different")) == \
        "SkipDecode runs at 1.02× [0.97, 1.07] the speed of full depth: no measurable difference."
    assert words.sentence("Eager recompute", _s(0.9, 0.85, 0.95, "slower")).endswith(": slower.")
    assert words.sentence("A", _s(1.5, 1.4, 1.6, "faster")).endswith("full depth: faster.")


def test_the_interval_rule_names_the_run_to_run_spread_only_when_there_is_one():
    assert words.interval_rule(0.0) == "its 95% interval is the t-interval over prompts"
    r = words.interval_rule(0.003)
    assert "t-interval over prompts with a run-to-run spread of 0.3% (one standard deviation of one ratio between timing runs" in r
    assert "of 1.2%" in words.interval_rule(0.0125)
    with pytest.raises(ValueError, match=r"run-to-run spread \(run_sd\) must be a number in \[0, 1\)"):
        words.interval_rule(-0.1)


def test_count_is_plural_unless_one():
    assert [words.count(n, "layer") for n in (0, 1, 2, 1500)] == ["0 layers", "1 layer", "2 layers", "1,500 layers"]

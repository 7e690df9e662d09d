"""The cross-page check: a fact glued on two pages has one value; a page made inconsistent on purpose fails it."""
import json

import pytest

from earlyexit.book import consistency


def _nb(path, values: dict):
    outs = [{"output_type": "display_data", "metadata": {"scrapbook": {"name": k, "mime_prefix": ""}},
             "data": {"text/plain": v}} for k, v in values.items()]
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "", "outputs": outs}]}))


def test_shared_facts_agree_and_a_changed_one_is_named(tmp_path):
    _nb(tmp_path / "02_a.ipynb", {"head_layers": "7.8", "threshold": "0.9", "fig_sweep": "<Figure size 1x1>",
                                   "fig_sweep_cite": "'Files: figures/02_sweep.pdf'"})
    _nb(tmp_path / "04_b.ipynb", {"head_layers": "7.8", "fig_sweep": "<Figure size 2x2>",
                                   "fig_sweep_cite": "'Files: figures/04_sweep.pdf'"})
    assert consistency.check(["02_a", "04_b", "99_not_run"], tmp_path) == []
    _nb(tmp_path / "04_b.ipynb", {"head_layers": "7.3"})          # the same fact, another value: made on purpose
    problems = consistency.check(["02_a", "04_b"], tmp_path)
    assert len(problems) == 1 and "'head_layers' has 2 values" in problems[0] and "02_a: 7.8" in problems[0]


def test_a_page_may_state_its_own_timing_prompts_in_words(tmp_path):
    # the cpu book times 6 prompts in chapter 3 and 12 in chapter 4: a per-page count, as number and as phrase
    _nb(tmp_path / "03_a.ipynb", {"timing_prompts": "6", "timing_prompts_str": "'6 prompts'", "head_layers": "7.8"})
    _nb(tmp_path / "04_b.ipynb", {"timing_prompts": "12", "timing_prompts_str": "'12 prompts'", "head_layers": "7.8"})
    assert consistency.check(["03_a", "04_b"], tmp_path) == []
    _nb(tmp_path / "04_b.ipynb", {"timing_prompts_str": "'12 prompts'", "head_layers": "7.3"})
    assert len(consistency.check(["03_a", "04_b"], tmp_path)) == 1                   # other facts still checked


@pytest.mark.browser
def test_the_built_book_glues_one_value_per_fact():
    """Run after the book is built (`make test` builds the smoke book first): every glue key that two pages share
    has one value across them."""
    from earlyexit import paths

    names = [p.stem for p in consistency.pages(paths.GENERATED)]
    if not names:
        pytest.fail("no executed notebooks: build the book first with `python -m earlyexit book --profile smoke`",
                    pytrace=False)
    problems = consistency.check(names)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("profile", ["cpu", "smoke", "gpu", "llama1b"])
def test_the_book_has_one_consistency_target(profile):
    """Chapter 8's summary target, chapter 9's floor and both calibrations' risk tolerance are one number: a method
    is consistent enough when its mean ROUGE-L against the full model reaches the target, so the risk it may take
    is 1 - target."""
    from earlyexit.book import runner

    prof = runner.load_profile(profile)
    p8, p9 = prof.parameters("08_comparison"), prof.parameters("09_where_time_goes")
    assert p8["target"] == p9["consistency_floor"]
    assert p8["epsilon"] == pytest.approx(1 - p8["target"]) and p9["epsilon"] == pytest.approx(1 - p8["target"])

"""Chapter 2's page, built from hand-made results: each sentence branch by branch, its tables and figures."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from earlyexit.chapters import ch02

NAIVE = ["naive-mask", "naive-undefined"]


class Tok:
    """A tokenizer that spells token i as "<i>"."""

    def decode(self, ids):
        return "".join(f"<{int(i)}>" for i in ids)


class Prompts(list):
    """An evaluation set of prompt ids (``es.ids``, ``len(es)``)."""

    @property
    def ids(self):
        return list(self)


def test_key():
    assert ch02.key("naive-mask") == "naive_mask"


def test_scene_star_same_and_different():
    assert ch02.scene_star(True, 4) == "equals the full model's, because layer 4 already predicts it"
    assert ch02.scene_star(False, 4) == "differs from the full model's: layer 4 does not predict the full model's token"


def test_divergence_never_and_at_a_token():
    assert ch02.divergence(None) == "never diverges from the full model's"
    assert ch02.divergence(5) == "leaves the full model's at token 5"


def test_scene_divergence_says_a_shared_clause_once():
    assert ch02.scene_divergence({"naive-mask": None, "naive-undefined": None}) == \
        "With either naive form the text never diverges from the full model's."
    assert ch02.scene_divergence({"naive-mask": 5, "naive-undefined": 5}) == \
        "With either naive form the text leaves the full model's at token 5."
    assert ch02.scene_divergence(dict.fromkeys(["a", "b", "c"], 3)) == \
        "With every naive form the text leaves the full model's at token 3."


def test_scene_divergence_names_each_when_they_differ():
    s = ch02.scene_divergence({"naive-mask": None, "naive-undefined": 5})
    assert s == ("With naive-mask the text never diverges from the full model's; with naive-undefined it leaves "
                 "the full model's at token 5.")
    assert ch02.scene_divergence({"naive-mask": 2}) == "With naive-mask the text leaves the full model's at token 2."


def test_oracle_clause_exact_one_many_and_zero_tokens():
    assert ch02.oracle_clause(True, 8) == "is the full model's text throughout"
    assert ch02.oracle_clause(True, 8, plural=True) == "are the full model's throughout"
    assert ch02.oracle_clause(False, 1) == "leaves the full model's after 1 token"
    assert ch02.oracle_clause(False, 5) == "leaves the full model's after 5 tokens"
    assert ch02.oracle_clause(False, 5, plural=True) == "leave the full model's after 5 tokens"
    assert ch02.oracle_clause(False, 0) == "leaves the full model's at the first token"


def test_scene_oracle_same_and_different():
    assert ch02.scene_oracle({"naive-mask": (True, 8), "naive-undefined": (True, 8)}) == \
        "both naive texts are the full model's throughout"
    assert ch02.scene_oracle({"naive-mask": (False, 5), "naive-undefined": (False, 5)}) == \
        "both naive texts leave the full model's after 5 tokens"
    assert ch02.scene_oracle(dict.fromkeys("abc", (False, 1))) == \
        "every naive text leaves the full model's after 1 token"
    assert ch02.scene_oracle({"naive-mask": (True, 8), "naive-undefined": (False, 3)}) == \
        "the naive-mask text is the full model's text throughout and the naive-undefined text leaves the full " \
        "model's after 3 tokens"
    assert ch02.scene_oracle({"a": (False, 1), "b": (False, 2), "c": (True, 8)}) == \
        "the a text leaves the full model's after 1 token, the b text leaves the full model's after 2 tokens and " \
        "the c text is the full model's text throughout"
    assert ch02.scene_oracle({"naive-mask": (False, 2)}) == "the naive-mask text leaves the full model's after 2 tokens"


def _scene(diverge_at=None, star_token=11):
    """A 4-token scene: full depth and two naive strategies; the exiting token is t = 1."""
    full = [10, 11, 12, 13]
    rows = [{"strategy": "full depth", "t": t, "token": full[t], "same": 1.0, "kl": 0.0} for t in range(4)]
    for i, s in enumerate(NAIVE):
        for t in range(4):
            tok = star_token if t == 1 else full[t]
            same = 0.0 if (s == "naive-undefined" and diverge_at is not None and t >= diverge_at) else 1.0
            rows.append({"strategy": s, "t": t, "token": tok, "same": same, "kl": 0.1 * (i + 1) * t})
    return pd.DataFrame(rows)


def _oracle(exact=(1.0, 1.0), ttd=(4, 4)):
    return pd.DataFrame({"strategy": NAIVE, "prompt": [0, 0], "exact_match": exact, "ttd": ttd,
                         "tokens": ["10 11 12 13", "10 11 12 9"]})


def test_scene_notes_same_behaviour():
    n = ch02.scene_notes(_scene(), _oracle(), 0, 1, 4, NAIVE)
    assert n["scene_star"].startswith("equals")
    assert n["scene_kl_next_naive_mask"] == pytest.approx(0.2)
    assert n["scene_kl_mean_naive_undefined"] == pytest.approx(0.2 * 2.5)
    assert n["scene_div_naive_mask"] == n["scene_div_naive_undefined"] == "never diverges from the full model's"
    assert n["scene_div"] == "With either naive form the text never diverges from the full model's."
    assert n["scene_oracle_naive_mask"] == "is the full model's text throughout"
    assert n["scene_oracle"] == "both naive texts are the full model's throughout"


def test_scene_notes_different_behaviour():
    n = ch02.scene_notes(_scene(diverge_at=2, star_token=99), _oracle(exact=(1.0, 0.0), ttd=(4, 3)), 0, 1, 4, NAIVE)
    assert n["scene_star"].startswith("differs")
    assert n["scene_div_naive_undefined"] == "leaves the full model's at token 2"
    assert n["scene_div"].startswith("With naive-mask the text never diverges")
    assert n["scene_oracle_naive_undefined"] == "leaves the full model's after 3 tokens"
    assert "the naive-undefined text leaves" in n["scene_oracle"]


def test_scene_printout_brackets_the_exiting_token():
    text = ch02.scene_printout(Tok(), "x" * 300, _scene(), _oracle(), 0, 1, NAIVE)
    assert text.splitlines()[0] == "prompt (last 200 characters): " + repr("x" * 200)
    assert "      full depth: '<10>' ['<11>'] '<12><13>'" in text
    assert text.rstrip().endswith("naive-undefined: '<10><11><12><9>'")


def test_pick_scene_clips_to_the_run():
    lm = SimpleNamespace(num_layers=6)
    es = Prompts([[1, 2]] * 3)
    full = pd.DataFrame({"prompt": [0, 1, 2], "tokens": ["1 2 3 4", "1 2 3 4", "1 2 3"]})
    b, t, e, exits = ch02.pick_scene(lm, es, full, prompt=8, token=3, exit=9, n_new=8)
    assert (b, t, e) == (2, 1, 5)       # last prompt; 3 tokens leave t <= 1; exit below the top
    assert exits == (6, 5)


def test_mask_vs_undefined_each_branch():
    assert ch02.mask_vs_undefined(0.84, np.nan) == ""
    assert ch02.mask_vs_undefined(0.84375, 0.84375) == \
        "Treating a hole as a zero key costs as much as masking it here (ROUGE-L 0.84 for both under oracle exits)."
    worse = ch02.mask_vs_undefined(0.48, 0.33)
    assert worse.startswith("Treating a hole as a zero key is worse") and "ROUGE-L 0.33 against 0.48" in worse
    about = ch02.mask_vs_undefined(0.50, 0.49)
    assert about.startswith("Treating a hole as a zero key costs about as much") and "0.49 against 0.50" in about
    assert ch02.mask_vs_undefined(0.30, 0.40).startswith("Masking the hole is, surprisingly, worse")


def test_interaction_sentence_each_branch():
    assert ch02.interaction_sentence(-0.45).startswith("The two harms do not add up: the interaction term is -0.45,")
    assert ch02.interaction_sentence(0.12).startswith("The two harms compound: the interaction term is +0.12,")
    assert ch02.interaction_sentence(-0.001) == "The two harms simply add: the interaction term is zero."
    assert ch02.interaction_sentence(0.0) == "The two harms simply add: the interaction term is zero."
    assert ch02.interaction_sentence(0.03) == "The two harms roughly add: the interaction term is 0.03."


def test_harm_table_rows_in_reading_order():
    parts = ["total", "cache", "exit_decision", "interaction"]
    harm = pd.DataFrame({"strategy": ["naive-mask"] * 4, "part": parts, "mean": [0.5, 0.2, 0.4, -0.1],
                         "lo": [0.4, 0.1, 0.3, -0.2], "hi": [0.6, 0.3, 0.5, 0.0]})
    t = ch02.harm_table(harm).data
    head = "part of the loss (1 − ROUGE-L vs full), mean [95% CI]"
    assert list(t.columns) == [head, "naive-mask"]
    assert list(t[head]) == ["exit decisions alone", "cache alone", "interaction", "total"]
    assert t.set_index(head).loc["interaction", "naive-mask"] == "-0.10 [-0.20, 0.00]"


def test_quality_table_geometric_perplexity_and_blank_without_reference():
    runs = pd.DataFrame({"run": ["full depth"] * 2 + ["oracle exits"] * 2, "strategy": ["naive-mask"] * 4,
                         "layers": [6.0, 6.0, 4.0, 5.0], "rouge_full": [1.0, 1.0, 0.5, 0.7],
                         "rouge_ref": [0.2, 0.3, 0.1, 0.2], "ppl_ref": [4.0, 9.0, np.nan, np.nan]})
    table, ppl = ch02.quality_table(runs, seed=0, n_boot=20)
    assert ppl[("full depth", "naive-mask")] == pytest.approx(6.0)
    assert math.isnan(ppl[("oracle exits", "naive-mask")])
    assert table.loc[("full depth", "naive-mask"), "reference perplexity (geo. mean)"] == "6.0"
    assert table.loc[("oracle exits", "naive-mask"), "reference perplexity (geo. mean)"] == ""
    assert table.loc[("full depth", "naive-mask"), "layers / step"] == "6.0 [6.0, 6.0]"
    first, second = ch02.quality_shown(table).data.split("</table>")[:2]
    assert ">run</th>" in first and ">cache</th>" in first and "layers / step" in first and "reference" not in first
    assert "reference perplexity (geo. mean; blank: not measured)" in second and ">6.0</td>" in second


def test_mass_table_leaves_out_layers_without_holes():
    mass_s = pd.DataFrame({"layer": [1, 2, 3], "mean": [np.nan, 0.0114, 0.2], "lo": [np.nan, 0.01, 0.1],
                           "hi": [np.nan, 0.013, 0.3], "n": [0, 1, 3]})
    t = ch02.mass_table(mass_s).data
    assert list(t["layer"]) == [2, 3]
    assert list(t["attention mass on holes, mean [95% CI]"]) == ["0.011 [0.010, 0.013]", "0.200 [0.100, 0.300]"]
    assert "nan" not in ch02.mass_table(mass_s).to_html().lower().replace("nanum", "")


def test_oracle_and_sweep_tables_read_without_internal_names():
    pts = pd.DataFrame({"strategy": ["naive-mask", "naive-mask", "lazy-recompute"], "exact_match": [1.0, 0.0, 1.0],
                        "ttd": [8, 2, 8], "rouge_full": [1.0, 0.5, 1.0], "layers": [4.0, 5.0, 6.0]})
    t = ch02.oracle_table(pts)
    assert list(t.data.columns) == ["cache (oracle exits)", "outputs identical to full depth",
                                    "tokens until the first difference", "ROUGE-L vs full", "layers / token"]
    html = t.to_html()
    assert "50%" in html and "exact_match" not in html
    summ = pd.DataFrame({"series": ["naive-mask"], "label": ["softmax 0.9 / naive-mask"], "layers": [4.0],
                         "layers_lo": [3.5], "layers_hi": [4.5], "rouge_full": [0.8], "rouge_full_lo": [0.7],
                         "rouge_full_hi": [0.9], "ttd": [3.0], "ttd_lo": [2.0], "ttd_hi": [4.0]})
    row = ch02.sweep_table(summ).data.iloc[0]
    assert row["ROUGE-L vs full, mean [95% CI]"] == "0.80 [0.70, 0.90]" and row["layers / token"] == "4.0 [3.5, 4.5]"


def test_free_exits_counts_early_steps_and_frequent_tokens():
    free = pd.DataFrame({"exits": ["6 1 2 6", "6 2 2 5"], "tokens": ["9 7 7 8", "9 7 7 7"],
                         "layers": [3.0, 3.0], "rouge_full": [0.1, 0.3]})
    f = ch02.free_exits(free, Tok(), early=2)
    assert f["early"] == pytest.approx(4 / 6)
    assert f["common"].index[0] == "<7>" and f["top_share"] == pytest.approx(5 / 6)
    assert f["rouge"] == pytest.approx(0.2)


def test_figures_draw():
    import matplotlib.pyplot as plt

    mass_s = pd.DataFrame({"layer": [1, 2], "mean": [0.1, 0.2], "lo": [0.0, 0.1], "hi": [0.2, 0.3]})
    surv_s = pd.DataFrame({"strategy": ["a", "a", "b", "b"], "k": [0, 1, 0, 1], "mean": [1.0, 0.5, 1.0, 1.0],
                           "lo": [1.0, 0.0, 1.0, 1.0], "hi": [1.0, 1.0, 1.0, 1.0]})
    for fig in (ch02.mass_figure(mass_s), ch02.survival_figure(surv_s, ["a", "b"])):
        assert fig.axes
        assert all(ax.get_legend() is None for ax in fig.axes)      # a key, where there is one, is off the data
        plt.close(fig)
    assert len(ch02.survival_figure(surv_s, ["a", "b"]).legends) == 1
    plt.close("all")

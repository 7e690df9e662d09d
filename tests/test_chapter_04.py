"""Chapter 4's sentences, branch by branch: no "to within 0.00 layers", no "0.0 layers are saved"."""
from earlyexit.chapters import ch04


def test_parts_add_up_exactly_or_within_rounding():
    assert ch04.parts_add_up(30, 0.001) == "The three parts add up to exactly 30 layers for every point."
    s = ch04.parts_add_up(30, 0.04)
    assert "to within 0.04 layers" in s and "0.00" not in s


def test_oracle_saving_zero_or_some():
    assert "no layer is saved" in ch04.oracle_saving(0.02) and "0.0" not in ch04.oracle_saving(0.02)
    assert ch04.oracle_saving(1.26) == "under oracle exits only 1.3 layers per token are saved"


def _sp(r, lo, hi, v):
    return {"ratio": r, "lo": lo, "hi": hi, "verdict": v, "digits": 2}


def test_lazy_vs_eager_faster_slower_or_indistinguishable():
    assert ch04.lazy_vs_eager(_sp(1.2, 1.1, 1.3, "faster")).startswith("Batching the recompute pays")
    assert "slower than eager" in ch04.lazy_vs_eager(_sp(0.8, 0.7, 0.9, "slower"))
    same = ch04.lazy_vs_eager(_sp(1.01, 0.95, 1.07, "no different"))
    assert "indistinguishable" in same and "1.01× [0.95, 1.07]" in same
    one = ch04.lazy_vs_eager(_sp(0.96, float("nan"), float("nan"), "no different"))
    assert one == "With the same exits, lazy recompute runs at 0.96× (one timed run, no interval) eager recompute's speed."


def _pts():
    import pandas as pd

    return pd.DataFrame({"rule": ["softmax", "softmax", "oracle"], "threshold": [0.9, 0.9, float("nan")],
                         "strategy": ["lazy-recompute", "eager-recompute", "lazy-recompute"],
                         "own_layers": [20.0, 20.0, 18.0], "recompute_layers": [8.0, 10.0, 9.0],
                         "pending_layers": [2.0, 0.0, 3.0], "flop_fraction": [0.9, 1.0, 0.8],
                         "head_checks": [10.0, 10.0, 1.0], "rouge_full": [1.0, 1.0, 1.0]})


def test_accounting_points_and_parts_add_up():
    acc = ch04.accounting(_pts())
    assert list(acc.index) == ["0.9, lazy", "0.9, eager", "oracle, lazy"]
    assert list(acc["total"]) == [30.0, 30.0, 30.0]
    t = ch04.accounting_table(acc).data
    assert list(t.columns)[:2] == ["threshold, recompute", "own layers / token"] and list(t.index) == [0, 1, 2]
    assert not any("_" in c for c in t.columns)
    html = ch04.accounting_table(acc).to_html()
    assert ">20.00<" in html and ">10.0<" in html and "20.000000" not in html     # 2 decimals, head checks 1


def test_accounting_figure_keeps_its_legend_off_the_bars():
    import matplotlib.pyplot as plt

    fig = ch04.accounting_figure(ch04.accounting(_pts()), 30, "softmax")
    assert fig.axes[0].get_legend() is None and len(fig.legends) == 1
    plt.close(fig)


def test_check_timing_and_quality_tables_read_as_words():
    import pandas as pd

    check = pd.DataFrame({"kind": ["code", "prose"], "eager-recompute": [1.0, 0.0], "lazy-recompute": [1.0, 1.0],
                          "tokens": [32, 32]}, index=pd.Index([0, 1], name="prompt"))
    t = ch04.check_table(check).data
    assert list(t.columns) == ["prompt", "kind", "lazy = full depth", "eager = full depth", "tokens generated"]
    assert list(t["eager = full depth"]) == ["yes", "no"]
    ts = pd.DataFrame([_sp(1.003, 0.97, 1.04, "no different")], index=pd.Index(["full depth"], name="method"))
    t = ch04.timing_table(ts, pd.Series([30.0], index=["full depth"])).data
    assert t.iloc[0, 1] == "1.00× [0.97, 1.04]" and t.iloc[0, 0] == "full depth"
    summ = pd.DataFrame({"strategy": ["lazy-recompute"], "label": ["softmax 0.9 / lazy-recompute"], "layers": [30.0],
                         "layers_lo": [29.0], "layers_hi": [31.0], "rouge_full": [1.0], "rouge_full_lo": [1.0],
                         "rouge_full_hi": [1.0]})
    assert ch04.quality_table(summ).data.iloc[0]["ROUGE-L vs full, mean [95% CI]"] == "1.00 [1.00, 1.00]"

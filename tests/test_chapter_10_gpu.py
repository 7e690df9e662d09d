"""Chapter 10's GPU section (earlyexit.chapters.gpu): the recorded H200 measurement read back, and every sentence
branch on small hand-made tables."""
import pandas as pd
import pytest

from earlyexit.chapters import gpu


def test_the_recorded_measurement_reads_into_tables_and_sentences():
    u, s = gpu.load()
    t = gpu.units_table(u)
    assert len(t) == u["shape"].nunique() >= 3 and not t.isna().any().any()
    assert (t["measured / roofline"].astype(float) > 0).all()
    st = gpu.spec_table(s)
    assert set(st["drafts"]) == {"all accepted", "rejected"} and len(st) == len(s)
    n = gpu.notes(u, s)
    assert n["gpu_name"] == "H200" and n["gpu_acc_lo"] <= n["gpu_acc_hi"]
    assert n["gpu_spec_error"].startswith(f"Over the {len(s)} measured bounds the cost model ")


def _tables(lossless=(True, True), pred=(2.5, 0.4)):
    rows = []
    for shape in ("A", "B"):
        for k, v in ((1, 1e-3), (5, 1.5e-3)):
            rows.append({"unit": "layer", "size": k, "seconds": v, "seconds_roofline": 5e-4, "shape": shape,
                         "layers_built": 4, "dtype": "bfloat16", "device": "NVIDIA H200"})
        rows.append({"unit": "head", "size": 1, "seconds": 2e-4, "seconds_roofline": 1e-4, "shape": shape,
                     "layers_built": 4, "dtype": "bfloat16", "device": "NVIDIA H200"})
    s = pd.DataFrame([{"shape": "A", "construction": c, "L": 8, "E": 2, "d": 6, "acceptance": a, "ratio": r,
                       "lo": r - 0.1, "hi": r + 0.1, "full_ms_per_token": 10.0, "spec_ms_per_token": 10.0 / r,
                       "predicted_here": p, "predicted_roofline": p, "lossless": ok}
                      for c, a, r, p, ok in (("accepting", 1.0, 2.0, pred[0], lossless[0]),
                                             ("rejecting", 0.0, 0.4, pred[1], lossless[1]))])
    return pd.DataFrame(rows), s


def test_over_and_under_prediction_and_the_unpriced_time_of_a_round():
    n = gpu.notes(*_tables(pred=(2.5, 0.4)))
    assert n["gpu_over_lo"] == pytest.approx(2.0) and n["gpu_five_hi"] == pytest.approx(1.5)
    # 25% and 0%: median 12%; a round of 7 tokens: 7 * (5 - 10 / 2.5) = 7 ms unpriced
    assert n["gpu_spec_error"] == ("Over the 2 measured bounds the cost model over-predicts by a median of 12% "
                                   "(worst 25%): at acceptance 1 a round takes 7 ms more than the units measured "
                                   "one at a time add up to.")
    assert "under-predicts" in gpu.notes(*_tables(pred=(1.5, 0.3)))["gpu_spec_error"]


def test_ties_are_named_only_where_an_output_differed():
    assert gpu.notes(*_tables())["gpu_ties"].startswith("Every run's output equalled")
    t = gpu.notes(*_tables(lossless=(True, False)))["gpu_ties"]
    assert t.startswith("On 1 shape (A) the bf16 output differed") and "fp32" in t
    assert gpu._span(7.2, 31.4) == "7 to 31" and gpu._count(2, "shape") == "2 shapes"
    assert gpu.spec_table(_tables(lossless=(True, False))[1])["same output"].tolist() == \
        ["yes", "no (bf16 ties)"]


def test_an_unrecorded_gpu_is_refused_with_the_recorded_ones(tmp_path):
    with pytest.raises(FileNotFoundError, match="measured: h200"):
        gpu.load("a100")
    with pytest.raises(FileNotFoundError, match="measured: none"):
        gpu.load("h200", tmp_path)

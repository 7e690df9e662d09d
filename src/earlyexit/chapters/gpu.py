"""Chapter 10's one measurement on a GPU: what ``scripts/gpu-check --out data/measured`` recorded on an H200
(``data/measured/h200_units.csv``, ``h200_spec.csv``; provenance in ``data/measured/README.md``), beside the
roofline's and the cost model's prices, as tables and sentences. The numbers are a dataset, like the published ones:
a machine lent for minutes measured them, and no build can rerun them without one."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .. import paths

MEASURED = paths.REPO_ROOT / "data" / "measured"


def load(name: str = "h200", root: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The unit costs and the self-speculation bounds measured on the GPU ``name``."""
    root = root or MEASURED
    files = [root / f"{name}_units.csv", root / f"{name}_spec.csv"]
    missing = [str(f.name) for f in files if not f.exists()]
    if missing:
        have = sorted({f.name.rsplit("_", 1)[0] for f in root.glob("*_units.csv")})
        raise FileNotFoundError(f"no GPU measurement {name!r} in {root.name}/ (missing {', '.join(missing)}); "
                                f"measured: {', '.join(have) or 'none'}")
    return pd.read_csv(files[0]), pd.read_csv(files[1])


def _at(u: pd.DataFrame, unit: str, size: int, col: str = "seconds") -> pd.Series:
    g = u[(u.unit == unit) & (u["size"] == size)].set_index("shape")[col]
    return g[~g.index.duplicated()]


def units_table(u: pd.DataFrame) -> pd.DataFrame:
    """Per shape: a layer over one token and the head, measured and as the roofline prices them (ms), and a layer
    over five tokens against one (measured)."""
    shapes = list(dict.fromkeys(u["shape"]))
    l1, r1 = _at(u, "layer", 1), _at(u, "layer", 1, "seconds_roofline")
    l5, h, rh = _at(u, "layer", 5), _at(u, "head", 1), _at(u, "head", 1, "seconds_roofline")
    built = u.groupby("shape")["layers_built"].first()
    return pd.DataFrame({"model shape": shapes,
                         "layers built": [int(built[s]) for s in shapes],
                         "layer, 1 token (ms)": [f"{1e3 * l1[s]:.2f}" for s in shapes],
                         "roofline (ms)": [f"{1e3 * r1[s]:.2f}" for s in shapes],
                         "measured / roofline": [f"{l1[s] / r1[s]:.2f}" for s in shapes],
                         "5 tokens / 1 token": [f"{l5[s] / l1[s]:.2f}" for s in shapes],
                         "head (ms)": [f"{1e3 * h[s]:.2f}" for s in shapes],
                         "head / roofline": [f"{h[s] / rh[s]:.2f}" for s in shapes]})


def spec_table(s: pd.DataFrame) -> pd.DataFrame:
    """The self-speculation bounds measured on the GPU, beside the cost model's speed-up at the measured acceptance
    from the units measured there and from the roofline."""
    return pd.DataFrame({
        "shape": s["shape"], "drafts": s["construction"].map({"accepting": "all accepted",
                                                                    "rejecting": "rejected"}),
        "full depth (ms / token)": s["full_ms_per_token"].map(lambda v: f"{v:.1f}"),
        "measured speed-up [95%]": [f"{r:.2f} [{lo:.2f}, {hi:.2f}]" for r, lo, hi in zip(s["ratio"], s["lo"], s["hi"])],
        "predicted from units": s["predicted_here"].map(lambda v: f"{v:.2f}"),
        "predicted by roofline": s["predicted_roofline"].map(lambda v: f"{v:.2f}"),
        "same output": s["lossless"].map(lambda v: "yes" if v else "no (bf16 ties)")})


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _span(lo: float, hi: float) -> str:
    """'7' or '7 to 31' (whole numbers)."""
    return f"{lo:.0f}" if f"{lo:.0f}" == f"{hi:.0f}" else f"{lo:.0f} to {hi:.0f}"


def notes(u: pd.DataFrame, s: pd.DataFrame) -> dict:
    """The GPU section's numbers and sentences: how far the eager engine's units sit above the roofline, and how
    the measured bounds compare with the cost model's prediction from the units measured on the same GPU."""
    l1, r1, l5 = _at(u, "layer", 1), _at(u, "layer", 1, "seconds_roofline"), _at(u, "layer", 5)
    over, five = (l1 / r1).to_numpy(float), (l5 / l1).to_numpy(float)
    acc = s[s.construction == "accepting"]
    err = (s["predicted_here"] / s["ratio"] - 1).to_numpy(float)
    # what the units leave unpriced in a round at acceptance 1 (a round emits d + 1 tokens)
    unpriced = ((acc["spec_ms_per_token"] - acc["full_ms_per_token"] / acc["predicted_here"]) * (acc["d"] + 1))
    med = float(np.median(np.abs(err)))
    direction = "over-predicts" if np.median(err) > 0 else "under-predicts"
    ties = s[~s["lossless"].astype(bool)]
    tie_s = ("Every run's output equalled full depth's token for token." if ties.empty else
             f"On {_count(ties['shape'].nunique(), 'shape')} ({', '.join(dict.fromkeys(ties['shape']))}) the bf16 output "
             f"differed from full depth's where two logits were exactly equal in bf16: the verification pass and full "
             f"depth round differently and break the tie differently. In fp32 the same decoding gave identical output "
             f"(checked on the all-accepting model; data/measured/README.md): lossless means identical up to ties at "
             f"the arithmetic's precision.")
    return {"gpu_name": str(u["device"].iloc[0]).replace("NVIDIA ", ""), "gpu_d": int(s["d"].iloc[0]), "gpu_shapes": int(u["shape"].nunique()),
            "gpu_over_lo": float(over.min()), "gpu_over_hi": float(over.max()),
            "gpu_five_lo": float(five.min()), "gpu_five_hi": float(five.max()),
            "gpu_acc_lo": float(acc["ratio"].min()), "gpu_acc_hi": float(acc["ratio"].max()),
            "gpu_pred_lo": float(acc["predicted_here"].min()), "gpu_pred_hi": float(acc["predicted_here"].max()),
            "gpu_spec_error": (f"Over the {len(s)} measured bounds the cost model {direction} by a median of "
                               f"{med:.0%} (worst {float(np.max(np.abs(err))):.0%}): at acceptance 1 a round takes "
                               f"{_span(unpriced.min(), unpriced.max())} ms more than the units measured one at a "
                               f"time add up to."),
            "gpu_ties": tie_s}

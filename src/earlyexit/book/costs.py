"""What decoding costs in FLOPs: per-step breakdowns of a point table, and the head in decoder layers."""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import metrics


def flop_breakdown(lm, df: pd.DataFrame) -> pd.DataFrame:
    """Per row of a point table: the FLOPs per decoding step of decoder layers (own and recompute),
    K/V copies and head evaluations, as fractions of a full-depth step at the same context."""
    cfg = lm.config
    L = cfg.num_hidden_layers
    ctx = df["prompt_len"] + df["n_steps"] / 2 + 1          # mean context of the decoding steps
    lf = np.array([metrics.layer_flops(cfg, c) for c in ctx])
    hf = metrics.head_flops(cfg)
    full = L * lf + hf
    return pd.DataFrame({
        "layers": df["own_layers"] * lf / full,
        "recompute": df["recompute_layers"] * lf / full,
        "kv_copies": df["copied_kv"] * metrics.kv_projection_flops(cfg) / full,
        "head": df["head_checks"] * hf / full,
    }, index=df.index)


def head_in_layers(lm, ctx: int = 64) -> float:
    """How many decoder layers one evaluation of the shared head costs (FLOPs, at context ``ctx``)."""
    return metrics.head_flops(lm.config) / metrics.layer_flops(lm.config, ctx)


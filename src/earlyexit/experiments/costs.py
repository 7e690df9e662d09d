"""What decoding costs: in FLOPs (per-step breakdowns of a point table, the head in decoder layers), and in
time, through the measured cost model (:mod:`earlyexit.experiments.costmodel`): predicted against measured for
every timed run, and a run's time split into its parts."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from . import costmodel, metrics
from .. import store


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



# ----------------------------------------------------------------------------------- time: the cost model at work


def _phases(calls) -> dict:
    """A calls record (JSON text or dict) as {phase: {key: count}}; a bare {key: count} is the decode phase."""
    c = json.loads(calls) if isinstance(calls, str) else dict(calls)
    return c if {"prefill", "decode"} & set(c) else {"decode": c}


def predicted_seconds(calls, units: pd.DataFrame, phases=("prefill", "decode"), **kw) -> float:
    """The cost model's time for the recorded ``calls`` (:func:`earlyexit.experiments.costmodel.predict`), over
    ``phases``."""
    c = _phases(calls)
    return float(sum(costmodel.predict(c.get(ph, {}), units, **kw)["total"] for ph in phases))


def validation(lm, units: pd.DataFrame, models=None) -> pd.DataFrame:
    """Predicted against measured seconds for every timed run of this library version in the result store on
    ``lm`` (or on each model of ``models``): batch-1 and batched timings (prompt pass taken out, as timed),
    replayed exits, self-speculation and its full-depth reference (prompt pass included), and the batched
    sweep points (prompt pass included). One row per timed run: source, method, measured_s, predicted_s,
    rel_err = predicted / measured − 1."""
    rows = []
    for m in (models or [lm]):
        for params, df in store.entries("timing", model=m):
            for r in df.itertuples():
                rows.append({"source": "batch timing" if r.batch > 1 else "batch-1 timing",
                             "method": f"{params.get('rule')} / {params.get('strategy')}",
                             "measured_s": r.wall_s - r.prefill_s, "predicted_s": predicted_seconds(r.calls, units,
                                                                                                  ("decode",))})
        for params, df in store.entries("timing_replay", model=m):
            for r in df.itertuples():
                rows.append({"source": "replayed exits", "method": f"scripted / {params.get('strategy')}",
                             "measured_s": r.wall_s - r.prefill_s,
                             "predicted_s": predicted_seconds(r.calls, units, ("decode",))})
        for params, df in store.entries("spec_point", model=m):
            for r in df.itertuples():
                rows.append({"source": "self-speculation", "method": f"self-spec E={r.E} d={r.d}",
                             "measured_s": r.spec_s, "predicted_s": predicted_seconds(r.spec_calls, units)})
                rows.append({"source": "self-speculation", "method": "full / naive-mask",
                             "measured_s": r.full_s, "predicted_s": predicted_seconds(r.full_calls, units)})
        for params, df in store.entries("point", model=m):
            if "calls" not in df or df.empty:
                continue
            r = df.iloc[0]
            rows.append({"source": "sweep point (batch)", "method": f"{params.get('rule')} / {params.get('strategy')}",
                         "measured_s": float(r["wall_s"]), "predicted_s": predicted_seconds(r["calls"], units)})
    out = pd.DataFrame(rows, columns=["source", "method", "measured_s", "predicted_s"])
    out["rel_err"] = out["predicted_s"] / out["measured_s"] - 1
    return out


def breakdown(calls, units: pd.DataFrame, per: float = 1.0, phases=("decode",)) -> dict:
    """The predicted time of ``calls`` split into :data:`earlyexit.experiments.costmodel.PARTS`, divided by ``per``
    (e.g. the number of decoding steps, for seconds per token)."""
    c = _phases(calls)
    parts = dict.fromkeys((*costmodel.PARTS, "total"), 0.0)
    for ph in phases:
        for k, v in costmodel.predict(c.get(ph, {}), units).items():
            parts[k] += v / per
    return parts


def replay_calls(lm, es, n_new: int, df: pd.DataFrame, strategy: str) -> pd.DataFrame:
    """What each prompt of ``es`` would run (counted, not timed) at batch 1 if it replayed the exit layers that
    the point table ``df`` recorded for it (rule "scripted": the decisions free) with ``strategy``. Rows
    (prompt, steps, calls). Cached. With the exits of oracle runs this is the bound of :func:`bounds`."""
    from ..engine import DecodeConfig, decode
    from .points import split_ints

    L = lm.num_layers
    scripts = {int(r["prompt"]): [L] + split_ints(r["exits"])[1:] for _, r in df.iterrows()}

    def compute():
        rows = []
        for b in range(len(es)):
            cfg = DecodeConfig.early_exit("scripted", strategy, exits=tuple(scripts[b][:n_new]))
            r = decode(lm, [es.ids[b]], cfg, n_new, stop_at_eos=False)
            rows.append({"prompt": b, "steps": n_new - 1, "calls": costmodel.calls_json(r.meta["calls"]["decode"])})
        return rows

    params = {"prompts": es.spec, "n_new": n_new, "strategy": strategy,
              "scripts": {str(b): scripts[b][:n_new] for b in range(len(es))}}
    return store.cached("replay_calls", params, compute, model=lm)


def seconds_per_token(rows: pd.DataFrame, units: pd.DataFrame, col: str = "calls", free_decisions: bool = False,
                      shortlist: int | None = None) -> float:
    """Mean predicted seconds per decoding step over ``rows`` (each with a calls column and its steps, or the
    timing tables' ``tok_s`` rows: one prompt each, ``max_new_tokens − 1`` steps), without the deciding part
    when ``free_decisions``."""
    tot, steps = 0.0, 0
    for r in rows.itertuples():
        c = json.loads(getattr(r, col))
        parts = costmodel.predict(c.get("decode", c), units, shortlist=shortlist)
        tot += parts["total"] - (parts["deciding"] if free_decisions else 0.0)
        steps += int(getattr(r, "steps", 0) or c.get("decode", c).get("steps", 0))
    return tot / max(steps, 1)


def simulate_calls(exits, L: int, strategy: str, prompt_len: int = 1, batch_steps: bool = True) -> dict:
    """The calls a decode would make (decode phase) if its rows exited at ``exits`` (a list per row of the exit
    layer of each decoding step, 1..L, L = full depth) with every decision free: the engine's batching replayed
    without running the model. Rows still running share one layer call; under lazy recompute a row whose
    pending tokens are due at a layer runs that layer in a call of its own with them (as the engine does);
    eager recompute runs the skipped layers of an exiting row right away; copy-forward projects their K/V.
    ``batch_steps``: the rows step together (one batched decode) rather than one prompt after another.

    With the exits of oracle runs this is the bound "oracle exits, free decisions"; with a rule's own exits,
    "free decisions". Matches the engine's own count (tested)."""
    from collections import Counter

    calls = Counter()
    rows = list(range(len(exits)))
    pending = {r: {} for r in rows}                  # col -> level (layers already run)
    T = max((len(e) for e in exits), default=0)
    groups = [rows] if batch_steps else [[r] for r in rows]
    for group in groups:
        for t in range(T):
            live = [r for r in group if t < len(exits[r])]
            if not live:
                continue
            calls["steps"] += 1
            ex = {r: int(exits[r][t]) for r in live}
            for l in range(L):
                running = [r for r in live if ex[r] > l]
                if not running:
                    break
                plain = []
                for r in running:
                    due = [c for c, lev in pending[r].items() if lev == l] if strategy == "lazy-recompute" else []
                    if due:
                        calls[f"layer:{len(due) + 1}:{len(due)}"] += 1
                        for c in due:
                            pending[r][c] = l + 1
                            if l + 1 >= L:
                                del pending[r][c]
                    else:
                        plain.append(r)
                if plain:
                    calls[f"layer:{len(plain)}"] += 1
            groups_out = Counter(ex[r] for r in live)        # rows exiting after the same layer act together
            for e, n in groups_out.items():
                calls[f"head:out:{n}"] += 1
                if e < L and strategy == "eager-recompute":
                    calls[f"layer:{n}:{n}"] += L - e
                elif e < L and strategy == "copy-forward":
                    calls[f"kv:{n}"] += L - e
            for r in live:
                if ex[r] < L and strategy == "lazy-recompute":
                    pending[r][t] = ex[r]
    return dict(calls)


def point_bounds(point: pd.DataFrame, oracle: pd.DataFrame, full: pd.DataFrame, units: pd.DataFrame, L: int,
                 strategy: str) -> dict:
    """Cost-model speeds (relative to full depth, decoding steps only, in the batch the point ran in) of a point
    table as measured-by-model, with free decisions (its own exits, deciding costing nothing) and with oracle
    exits (``oracle``: the oracle point of the same cache on the same prompts), from their recorded and
    simulated calls."""
    from .points import split_ints

    def dec(df):
        return _phases(df["calls"].iloc[0]).get("decode", {})

    t_full = costmodel.predict(dec(full), units)["total"]
    own = costmodel.predict(dec(point), units)
    exits = [split_ints(e)[1:] for e in oracle.sort_values("prompt")["exits"]]
    sim = costmodel.predict(simulate_calls(exits, L, strategy), units)
    return {"predicted": t_full / own["total"], "free decisions": t_full / (own["total"] - own["deciding"]),
            "oracle exits": t_full / sim["total"]}

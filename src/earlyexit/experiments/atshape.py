"""Unit costs and self-speculation measured at published model shapes on this machine, with random weights.

    u = atshape.units("Llama-3.2-1B", layers=2)                    # the cost model's table, timed here
    b = atshape.spec_bounds("TinyLlama-1.1B", exit_layer=6, draft_len=4, n_new=16)
    #   one row per construction: "accepting" (every draft accepted) and "rejecting" (none), each timed side by
    #   side with full depth on the same prompts (timing.paired_runs) and its measured acceptance

Timing depends on the weights' shapes, not their values, so a model of a published shape with random weights
(:func:`earlyexit.experiments.shapes.random_model`) costs here what the real one would. A shape too large to hold is
timed from a few of its layers (``layers``) at full width: a layer's cost and the head's do not depend on how many
layers there are. Self-speculation needs the whole depth, so its bounds are measured only at shapes that fit.
Nothing is built when the result is in the store.
"""
from __future__ import annotations

import pandas as pd
import torch

from .. import store
from ..quiet import quiet
from ..engine import DecodeConfig, decode
from . import costmodel, forced, shapes, speeds, timing
from .evalset import EvalSet

UNIT_KS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, 40)   # layer calls over k tokens: a draft (1), a verification (d + 1),
#                                                   the same for 8 sequences decoding together
UNIT_ROWS = (1, 2, 4, 8)
CONSTRUCTIONS = {"accepting": forced.accepting, "rejecting": forced.rejecting}


def model_id(name: str, dtype: str, layers: int | None, seed: int, construction: str = "random",
             exit_layer: int | None = None) -> str:
    """What identifies a constructed model's weights in the result store."""
    return (f"random:{name}:{dtype}:layers={layers or shapes.shape(name).layers}:seed={seed}:{construction}"
            + (f":E={exit_layer}" if exit_layer else ""))


def build(name: str, dtype: str = "float32", layers: int | None = None, seed: int = 0, construction: str = "random",
          exit_layer: int | None = None):
    """A random model of shape ``name`` (optionally ``layers`` deep), constructed to accept or reject drafts from
    ``exit_layer`` (:data:`CONSTRUCTIONS`), tagged with its :func:`model_id` for the store."""
    if construction != "random" and construction not in CONSTRUCTIONS:
        raise ValueError(f"unknown construction {construction!r}; valid: random, {', '.join(CONSTRUCTIONS)}")
    model = shapes.random_model(name, dtype=dtype, layers=layers, seed=seed)
    if construction != "random":
        CONSTRUCTIONS[construction](model, exit_layer)
    model.weights_sha256 = model_id(name, dtype, layers, seed, construction, exit_layer)
    return model


def prompts(n: int, length: int, vocab: int, seed: int = 0) -> EvalSet:
    """``n`` prompts of ``length`` random token ids (random weights have no language to prompt)."""
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, vocab, (length,), generator=g).tolist() for _ in range(n)]
    return EvalSet([None] * n, ids, [None] * n, {"kind": "random", "n": n, "length": length, "vocab": vocab,
                                                 "seed": seed})


def units(name: str, dtype: str = "float32", layers: int | None = 2, ctx: int = 64, repeats: int = 3,
          shortlist: int = 8192, seed: int = 0):
    """The cost model's unit table (:func:`earlyexit.experiments.costmodel.measure_units`'s layout) for shape
    ``name`` on this machine, timed on a random model ``layers`` deep (all of them with ``None``); cached per shape,
    machine and thread count."""
    s = shapes.shape(name)

    def compute():
        model = build(name, dtype, layers, seed)
        return costmodel.time_units(model, ctx=ctx, shortlist=min(shortlist, s.vocab), repeats=repeats,
                                    prompt=list(range(100, 100 + ctx)), n_steps=8, layer_ks=UNIT_KS,
                                    head_rows=UNIT_ROWS)

    params = {"shape": name, "dtype": dtype, "layers": layers, "ctx": ctx, "repeats": repeats,
              "shortlist": min(shortlist, s.vocab), "seed": seed, **costmodel.machine_id()}
    return store.cached("shape_units", params, compute, model=f"random:{name}")


def spec_bounds(name: str, exit_layer: int, draft_len: int, n_new: int = 16, n_prompts: int = 2,
                prompt_len: int = 32, rounds: int = 2, dtype: str = "float32", seed: int = 0):
    """Self-speculation from ``exit_layer`` with ``draft_len`` drafts a round, on a whole random model of shape
    ``name`` built to accept every draft and built to reject them: each timed against full depth on the same
    random prompts, in turn, ``rounds`` times (:func:`earlyexit.experiments.timing.paired_runs`). One row per
    construction: acceptance (measured), ratio (speed relative to full depth, geometric mean over prompts), lo, hi
    (its 95% interval), verdict, lossless (the output equals full depth's on every prompt). Cached: the timings
    (``runs``, each ``group:round:ratio``) and what was decoded; the ratio and its interval are summarized from them
    on every call (:func:`earlyexit.experiments.speeds.paired_ratio`, with this process's run-to-run spread)."""
    s = shapes.shape(name)
    if not 1 <= exit_layer < s.layers:
        raise ValueError(f"exit_layer must be in [1, {s.layers - 1}] for {name}, got {exit_layer}")
    es = prompts(n_prompts, prompt_len, s.vocab, seed)
    cfg = DecodeConfig.self_speculation(exit_layer, draft_len)

    def compute():
        rows = []
        for construction in CONSTRUCTIONS:
            model = build(name, dtype, None, seed, construction, exit_layer)
            with quiet(f"self-speculation at the shape of {name}"):   # a large model's decode is bandwidth-bound
                runs = timing.paired_runs(model, es, n_new, cfg, rounds=rounds)
            sp = decode(model, es.ids, cfg, n_new, stop_at_eos=False)
            full = decode(model, es.ids, DecodeConfig.full(), n_new, stop_at_eos=False)
            rows.append({"shape": name, "construction": construction, "E": exit_layer, "d": draft_len,
                         "L": s.layers, "acceptance": sp.acceptance,
                         "runs": " ".join(f"{r.group}:{r.round}:{r.ratio:.9g}" for r in runs.itertuples()),
                         "lossless": sp.tokens.tolist() == full.tokens.tolist(), "n_new": n_new,
                         "prompts": n_prompts, "rounds": rounds})
            del model
        return rows

    params = {"shape": name, "E": exit_layer, "d": draft_len, "n_new": n_new, "prompts": n_prompts,
              "prompt_len": prompt_len, "rounds": rounds, "dtype": dtype, "seed": seed,
              "threads": torch.get_num_threads(), **costmodel.machine_id()}
    df = store.cached("shape_spec", params, compute, model=f"random:{name}")
    summ = pd.DataFrame([speeds.paired_ratio(_runs(text)) for text in df["runs"]])
    return df.assign(**{c: summ[c].to_numpy() for c in ("ratio", "lo", "hi", "verdict")})


def _runs(text: str) -> pd.DataFrame:
    """:func:`spec_bounds`' ``runs`` column (``group:round:ratio`` items) back as paired_runs-like rows."""
    rows = [t.split(":") for t in str(text).split()]
    return pd.DataFrame({"group": [int(g) for g, _, _ in rows], "round": [int(k) for _, k, _ in rows],
                         "ratio": [float(x) for _, _, x in rows]})

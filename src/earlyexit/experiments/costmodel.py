"""Where the time goes: unit costs timed on the machine that runs the book, and a run's predicted time.

A decoding run's :class:`~earlyexit.engine.Result` counts what ran (``meta["calls"]``): decoder-layer calls by
the number of tokens they carried (``layer:k``, or ``layer:k:r`` when ``r`` of them recomputed earlier tokens'
skipped entries), head evaluations by purpose and rows (``head:decide:r``, ``head:out:r``, ``head:draft:r``,
...), copy-forward K/V projections (``kv:r``) and decoding steps. :func:`measure_units` times each unit once
per machine, model and thread count:

* ``layer`` at k tokens at once (k = 1..16, and larger k for prompt passes), averaged over the model's layers,
  with the cache at a typical context; on a CPU the cost of k tokens is far from k times the cost of one;
* ``head`` over r rows, the full vocabulary, and ``head_short`` over the K most frequent tokens;
* ``decide``: the softmax and top-1 a confidence rule computes from the head's logits (per row);
* ``kv``: one layer's copy-forward K/V projection;
* ``check_<rule>``: a decision of a rule that reads no head (the exit classifier, saturation), per rows;
* ``step``: what a decoding step costs besides its layers and heads (embedding, RoPE, bookkeeping), from a
  full-depth run.

:func:`predict` adds the counted calls up at those costs and splits the total into own layers, recompute,
copies, deciding heads, the output head and overhead (:data:`PARTS`).
"""
from __future__ import annotations

import math
import platform

import numpy as np
import pandas as pd
import torch

from ..clock import now
from ..quiet import quiet
from ..engine import DecodeConfig, decode
from ..engine.adapter import adapter
from ..engine.cache import COMPUTED
from ..engine.classifier import ExitClassifier
from ..engine.fill import NaiveMask
from ..engine.loop import Engine
from ..engine.result import calls_json  # noqa: F401  (where the tables' calls columns are written)
from ..engine.rules import FullDepth, StepView, make_rule
from .. import store

PARTS = ("own layers", "recompute", "copies", "deciding", "output head", "overhead")
LAYER_KS = (*range(1, 17), 24, 32, 48, 64, 128, 256, 512, 1024)
HEAD_ROWS = (1, 2, 4, 8, 16, 32)
# head purposes: the head read to decide whether to exit, and the head read for the token emitted
DECIDING = ("decide", "hindsight", "draft", "draft_short")


def machine_id() -> dict:
    """What a unit cost depends on besides the model: the processor and the torch thread count."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {"cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__}


def _median_time(fn, repeats: int, device=None) -> float:
    fn()                                                    # warm-up
    ts = []
    for _ in range(repeats):
        t0 = now(device)
        fn()
        ts.append(now(device) - t0)
    return float(np.median(ts))


@torch.inference_mode()
def _units(lm, ctx: int, shortlist: int, repeats: int, classifier_hidden: int = 64, layer_ks=LAYER_KS,
           head_rows=HEAD_ROWS) -> list[dict]:
    A = adapter(lm).for_inference()       # the layout the decoding front door uses
    L, D = A.L, A.config.hidden_size

    def _t(fn, reps):
        return _median_time(fn, reps, A.device)

    g = torch.Generator().manual_seed(0)
    rows = []
    big = max(layer_ks)
    eng = Engine(A, 1, ctx + big + 1, FullDepth(L), NaiveMask(), 1)
    h0 = A.embed(torch.randint(0, A.vocab, (1, ctx), generator=g).to(A.device))
    cos, sin = A.rope(h0, torch.arange(ctx, device=A.device)[None])
    for l in range(L):                                      # a real context in the cache
        h0 = eng.layer(l, h0, slice(None), torch.arange(ctx), cos, sin, COMPUTED, audit=False)
    for k in layer_ks:
        h = torch.randn(1, k, D, generator=g).to(A.device, A.dtype)
        cols = torch.arange(ctx, ctx + k) if k > 1 else ctx
        c, s = A.rope(h, torch.arange(ctx, ctx + k, device=A.device)[None])

        def all_layers(h=h, cols=cols, c=c, s=s):
            for l in range(L):
                eng.layer(l, h, slice(None), cols, c, s, COMPUTED, audit=False)

        reps = repeats if k <= 64 else max(2, repeats // 4)
        rows.append({"unit": "layer", "size": k, "seconds": _t(all_layers, reps) / L})
    # the decisions are timed through the rules themselves; the classifier is untrained (its cost is its shape's)
    softmax, saturation = make_rule("softmax", L), make_rule("saturation", L)
    classifier = make_rule("classifier", L, classifier="untrained")
    classifier.attach(ExitClassifier(D, L, classifier_hidden).to(A.device, A.dtype).eval(), A.norm)
    K = min(shortlist, A.head.weight.shape[0])
    head_short = A.sub_head(torch.arange(K, device=A.device))
    for r in head_rows:
        h = torch.randn(r, D, generator=g).to(A.device, A.dtype)
        rows.append({"unit": "head", "size": r, "seconds": _t(lambda h=h: A.logits(h), repeats)})
        rows.append({"unit": "head_short", "size": r,
                     "seconds": _t(lambda h=h: head_short(h), repeats)})
        view = StepView(n=L // 2, t=0, n_new=1, h=h, h_prev=h.flip(0), logits=A.logits(h))
        for unit, rule in (("decide", softmax), ("check_classifier", classifier), ("check_saturation", saturation)):
            rows.append({"unit": unit, "size": r, "seconds": _t(lambda rule=rule: rule.decide(view), repeats)})
        c, s = A.rope(h[:, None], torch.zeros(r, 1, dtype=torch.long, device=A.device))
        rows.append({"unit": "kv", "size": r, "seconds": _t(
            lambda h=h, c=c, s=s: A.qkv(L - 1, h[:, None], c, s, with_q=False), repeats)})
    rows.append({"unit": "shortlist", "size": K, "seconds": float("nan")})
    return rows


def time_units(lm, ctx: int = 96, shortlist: int = 8192, repeats: int = 5, prompt=None, n_steps: int = 24,
               layer_ks=LAYER_KS, head_rows=HEAD_ROWS) -> list[dict]:
    """The unit costs of :func:`measure_units`, timed now (not cached) with the machine to itself
    (:func:`earlyexit.quiet.quiet`): ``layer_ks`` and ``head_rows`` choose the sizes (fewer for a large model timed
    from a few of its layers)."""
    ids = prompt or list(range(100, 100 + ctx))
    best = math.inf
    with quiet("the cost model's unit costs"):         # absolute times: nothing may run beside them
        rows = _units(lm, ctx, shortlist, repeats, layer_ks=layer_ks, head_rows=head_rows)
        for _ in range(3):
            pre = decode(lm, [ids], DecodeConfig.full(), 1, stop_at_eos=False)
            r = decode(lm, [ids], DecodeConfig.full(), n_steps + 1, stop_at_eos=False)
            best = min(best, (r.wall_s - pre.wall_s) / n_steps)
    units = pd.DataFrame(rows)
    part = predict(r.meta["calls"]["decode"], units, steps=False)["total"] / n_steps
    rows.append({"unit": "step", "size": 1, "seconds": max(best - part, 0.0)})
    return rows


def measure_units(lm, ctx: int = 96, shortlist: int = 8192, repeats: int = 5, prompt=None,
                  n_steps: int = 24) -> pd.DataFrame:
    """Unit costs (seconds) on this machine, cached per model, machine and thread count: rows (unit, size,
    seconds); units layer, head, head_short, decide, kv (see the module docstring) and step (size 1: the
    per-step overhead of a full-depth decode of ``prompt`` at batch 1, what its layers and head leave)."""
    params = {"ctx": ctx, "shortlist": shortlist, "repeats": repeats, "n_steps": n_steps, **machine_id()}
    return store.cached("cost_units", params, lambda: time_units(lm, ctx, shortlist, repeats, prompt, n_steps),
                        model=lm)


def _interp(units: pd.DataFrame, unit: str, size: float) -> float:
    u = units[units["unit"] == unit].sort_values("size")
    x, y = u["size"].to_numpy(float), u["seconds"].to_numpy(float)
    if size <= x[-1]:
        return float(np.interp(size, x, y))
    return float(y[-1] + (size - x[-1]) * (y[-1] - y[-2]) / (x[-1] - x[-2]))   # linear beyond the last


def _parse(key: str) -> tuple[str, list[int | str]]:
    kind, *rest = key.split(":")
    return kind, [int(x) if x.lstrip("-").isdigit() else x for x in rest]


def predict(calls: dict, units: pd.DataFrame, steps: bool = True, shortlist: int | None = None) -> dict:
    """Predicted seconds of the counted ``calls`` (one phase of ``Result.meta["calls"]``, or a dict of them
    summed by the caller) at ``units``' costs, split into :data:`PARTS` plus ``total``.

    A layer call over k tokens of which r recompute costs C(k): the own tokens are charged C(k − r) (what
    they would cost alone) and the recomputation the rest. A head read to decide (confidence rules, the
    oracle's hindsight, a draft) counts as deciding, with the softmax a rule computes on top; the head read
    for the emitted token as the output head. ``shortlist`` prices draft heads over that many rows."""
    out = dict.fromkeys(PARTS, 0.0)
    for key, n in calls.items():
        kind, args = _parse(key)
        if kind == "layer":
            k, r = args[0], (args[1] if len(args) > 1 else 0)
            cost = _interp(units, "layer", k)
            own = _interp(units, "layer", k - r) if k - r > 0 else 0.0
            out["own layers"] += n * own
            out["recompute"] += n * (cost - own)
        elif kind == "head":
            why, r = args[0], args[1]
            # a shortlist draft (head:draft_short) read K rows; ``shortlist`` prices full drafts as if it had
            unit = "head_short" if why == "draft_short" or (why == "draft" and shortlist) else "head"
            cost = _interp(units, unit, r)
            if why == "decide":
                out["deciding"] += n * (cost + _interp(units, "decide", r))
            elif why in DECIDING:
                out["deciding"] += n * cost
            else:
                out["output head"] += n * cost
        elif kind == "kv":
            out["copies"] += n * _interp(units, "kv", args[0])
        elif kind == "check":                               # a rule deciding without the head
            unit = f"check_{args[0]}"
            if (units["unit"] == unit).any():
                out["deciding"] += n * _interp(units, unit, args[1])
        elif kind == "steps" and steps:
            out["overhead"] += n * _interp(units, "step", 1)
    out["total"] = sum(out[p] for p in PARTS)
    return out

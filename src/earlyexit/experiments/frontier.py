"""What a decision rule can buy with an exact cache: its exit signals along the full model's own continuation,
and each rule replayed over them at many thresholds.

With an exact cache (lazy recompute) every token up to a method's first wrong exit sees exactly the keys and
values of full depth, so until then its hidden states, its exit signals and its exits are those of full depth's
own continuation. One pass of the full model per prompt therefore replays a rule at any threshold without
decoding again: :func:`signals` records, per generated token and per layer a rule may exit at, the top-1
probability of the exit's head (the softmax rule), the exit classifier's probability (the classifier rule), the
cosine between the hidden states after and before the layer (state saturation) and whether the exit keeps the
full model's token; :func:`replay` runs a rule over them and returns

* the exits up to and including the first wrong one, and so the share of the output that is identical to full
  depth before it first differs (``prefix``): exact, and a lower bound of ROUGE-L consistency, since the
  common prefix is a common subsequence;
* the per-token error rate and the mean exit over every token of the continuation;
* the calls the engine would make over the whole continuation (its layers with lazy recompute riding along,
  :func:`earlyexit.experiments.costs.simulate_calls`, plus the rule's decisions), for the cost model's speed.

That the replay reproduces the engine's exits and its first divergence is tested.
"""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pandas as pd
import torch

from . import costmodel
from .. import store
from .costs import simulate_calls

RULES = ("softmax", "classifier", "saturation")
# The thresholds each rule is replayed at: dense near 1, where the consistent exits are.
GRID = {"softmax": (0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9995, 0.9999),
        "classifier": (0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999),
        "saturation": (0.9, 0.95, 0.97, 0.98, 0.985, 0.99, 0.9925, 0.995, 0.9975, 0.999, 0.9999)}
COLUMN = {"softmax": "p", "classifier": "clf", "saturation": "sat"}   # each rule's signal in :func:`signals`


@torch.inference_mode()
def signals(lm, es, n_new: int, classifier: str, min_layer: int) -> pd.DataFrame:
    """Per prompt of ``es``, generated token ``t`` (0 is the prompt pass's, always at full depth) and layer
    ``n`` a rule may exit after (``min_layer`` .. L − 1): ``p`` the top-1 probability of head(norm(h_n)),
    ``clf`` the exit classifier's probability (``classifier``: its folder, as the classifier rule takes it),
    ``sat`` the cosine of the hidden states after and before layer ``n`` (the saturation rule's signal) and
    ``keep`` whether that exit predicts the full model's token. Along the full model's greedy continuation of
    ``n_new`` tokens. Cached."""
    from ..engine import DecodeConfig, decode
    from ..engine.adapter import adapter
    from ..engine.rules import StepView, make_rule
    from ..training.forward import forward_layers

    A = adapter(lm)
    L = A.L
    if not 1 <= min_layer < L:
        raise ValueError(f"min_layer must be in [1, {L - 1}] for a {L}-layer model, got {min_layer}")
    rules = {r: make_rule(r, L, **({"classifier": classifier} if r == "classifier" else {})) for r in RULES}
    for r in rules.values():
        r.bind(A)                                  # the classifier refuses a folder trained for another model here
    folder = rules["classifier"].folder()

    def compute():
        full = decode(lm, es.ids, DecodeConfig.full(), n_new, stop_at_eos=False)
        rows = []
        for b, ids in enumerate(es.ids):
            gen = full.sequences()[b]
            seq = torch.tensor([list(ids) + gen[:-1]], device=A.device)
            hs = forward_layers(A.model, seq, collect=range(max(min_layer - 2, 0), L))
            if min_layer == 1:
                hs[-1] = A.embed(seq)                  # the state before layer 1, for saturation there
            sl = slice(len(ids) - 1, len(ids) - 1 + len(gen))
            target = A.logits(hs[L - 1][0, sl]).argmax(-1)
            for n in range(min_layer, L):
                lg = A.head(A.norm(hs[n - 1][0, sl]))
                s = StepView(n=n, t=0, n_new=n_new, h=hs[n - 1][0, sl], h_prev=hs[n - 2][0, sl], logits=lg)
                score = {COLUMN[r]: rule.score(s) for r, rule in rules.items()}   # the engine's own signals
                keep = lg.argmax(-1) == target
                for t in range(len(gen)):
                    rows.append({"prompt": b, "t": t, "layer": n, **{c: float(v[t]) for c, v in score.items()},
                                 "keep": int(keep[t])})
        return rows

    params = {"prompts": es.spec, "n_new": n_new, "classifier": folder.name, "min_layer": min_layer}
    return store.cached("exit_signals", params, compute, model=lm)


def replay(sig: pd.DataFrame, L: int, rule: str, threshold: float) -> dict:
    """``rule`` (one of :data:`RULES`) at ``threshold`` over the signals of :func:`signals`: per prompt the exit
    of every decoding step of the continuation (``exits``, full depth for token 0, as the engine's
    ``exit_layer``) and the index of the first token whose exit is wrong (``first_error``; the length when none
    is); over all prompts ``prefix`` (mean share of the output before its first wrong token), ``error_rate``
    (wrong exits per decoding step), ``mean_exit`` (layers per decoding step) and ``calls`` (decode-phase calls:
    layers, lazy recompute, heads and decisions, as the engine counts them)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    col = COLUMN[rule]
    exits, first, wrong, steps = [], [], 0, 0
    extra = Counter()
    for _, g in sig.groupby("prompt", sort=True):
        T = int(g["t"].max()) + 1
        lay = sorted(g["layer"].unique())
        s = g.sort_values(["t", "layer"])
        score = s[col].to_numpy().reshape(T, len(lay))
        keep = s["keep"].to_numpy().reshape(T, len(lay))
        ex, fe = [L], T
        for t in range(1, T):
            hit = np.nonzero(score[t] >= threshold)[0]
            e = int(lay[hit[0]]) if len(hit) else L
            ncheck = (hit[0] + 1) if len(hit) else len(lay)
            if rule == "softmax":
                extra["head:decide:1"] += int(ncheck)
                if len(hit):
                    extra["head:out:1"] -= 1            # the deciding head's logits are the output
            else:                                       # decided without the head
                extra[f"check:{rule}:1"] += int(ncheck)
            if len(hit) and not keep[t, hit[0]]:
                wrong += 1
                fe = min(fe, t)
            ex.append(e)
        steps += T - 1
        exits.append(ex)
        first.append(fe)
    calls = Counter(simulate_calls([e[1:] for e in exits], L, "lazy-recompute", batch_steps=False))
    calls.update(extra)
    lens = [len(e) for e in exits]
    return {"rule": rule, "threshold": float(threshold), "exits": exits, "first_error": first,
            "prefix": float(np.mean([f / n for f, n in zip(first, lens)])),
            "error_rate": wrong / max(steps, 1),
            "mean_exit": float(np.mean([x for e in exits for x in e[1:]])) if steps else float(L),
            "calls": {k: v for k, v in calls.items() if v}}


def frontier(sig: pd.DataFrame, L: int, units: pd.DataFrame, grid: dict | None = None) -> pd.DataFrame:
    """Every rule of :data:`RULES` replayed at every threshold of ``grid`` (default :data:`GRID`): its prefix
    consistency, error rate, mean exit and the cost model's speed against full depth over the same
    continuation (``speed``, decisions counted; ``speed_free``, decisions free). One row per (rule,
    threshold), plus the oracle (every token at the lowest layer that keeps it, decided for free)."""
    T = sig.groupby("prompt")["t"].max() + 1
    full = costmodel.predict(simulate_calls([[L] * (int(n) - 1) for n in T], L, "lazy-recompute",
                                            batch_steps=False), units)["total"]
    rows = []
    for rule in RULES:
        for thr in (grid or GRID)[rule]:
            r = replay(sig, L, rule, thr)
            parts = costmodel.predict(r["calls"], units)
            rows.append({"rule": rule, "threshold": thr, "prefix": r["prefix"], "error_rate": r["error_rate"],
                         "mean_exit": r["mean_exit"], "speed": full / parts["total"],
                         "speed_free": full / (parts["total"] - parts["deciding"]),
                         "calls": json.dumps(r["calls"], sort_keys=True)})
    orc = oracle_exits(sig, L)
    parts = costmodel.predict(simulate_calls([e[1:] for e in orc], L, "lazy-recompute", batch_steps=False), units)
    rows.append({"rule": "oracle", "threshold": float("nan"), "prefix": 1.0, "error_rate": 0.0,
                 "mean_exit": float(np.mean([x for e in orc for x in e[1:]])), "speed": full / parts["total"],
                 "speed_free": full / parts["total"], "calls": ""})
    return pd.DataFrame(rows)


def oracle_exits(sig: pd.DataFrame, L: int) -> list[list[int]]:
    """Per prompt, the lowest layer whose exit keeps the full model's token at each decoding step (L where none
    does), token 0 at full depth: the exits of the oracle rule along the continuation."""
    out = []
    for _, g in sig.groupby("prompt", sort=True):
        k = g[g["keep"] == 1].groupby("t")["layer"].min()
        T = int(g["t"].max()) + 1
        out.append([L] + [int(k.get(t, L)) for t in range(1, T)])
    return out


def error_for_prefix(target: float, n: int) -> float:
    """The per-token error rate ε at which a run of ``n`` tokens, the first always right and each later one
    wrong with probability ε independently, keeps an expected share ``target`` of its output before the first
    wrong token (solved by bisection)."""
    if not 0 < target <= 1 or n < 1:
        raise ValueError(f"target must be in (0, 1] and n >= 1, got {target!r}, {n!r}")

    def share(eps):
        j = np.arange(1, n)                        # P(first error at j) = (1-ε)^(j-1) ε, share j/n
        return float(((1 - eps) ** (j - 1) * eps * j / n).sum() + (1 - eps) ** (n - 1))

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if share(mid) >= target else (lo, mid)
    return lo

"""Wall-clock speed, measured side by side and kept in the result cache.

Every timing entry's key holds the torch thread count it was measured with. Decoding speed is reported
as decoding steps per second: the prompt pass is timed separately and taken out.
"""
from __future__ import annotations

import math

import pandas as pd
import torch

from ..engine.loop import generate
from . import store
from .points import _kw, _rule_args, label, split_ints
from .prompts import EvalSet


def time_point(lm, es: EvalSet, n_new: int, rule: str = "full", strategy: str = "naive-mask", rule_kw=None,
               batch: int = 1, repeats: int = 2) -> pd.DataFrame:
    """Wall-clock decoding speed (cached): the first ``batch`` prompts decoded together, ``n_new``
    tokens each without stopping at EOS, best of ``repeats``. The prompt pass is timed separately
    (a one-token run) and taken out, so ``tok_s`` is decoding steps per second, all rows counted.
    At batch 1 each of the set's prompts is timed on its own (one row each)."""
    def run(ids):
        best = math.inf
        best_pre = math.inf
        layers = heads = 0.0
        for _ in range(repeats):
            pre = generate(lm, ids, 1, rule="full", stop_at_eos=False)
            tr = generate(lm, ids, n_new, rule=rule, strategy=strategy, rule_kw=_rule_args(rule_kw),
                          stop_at_eos=False)
            best, best_pre = min(best, tr.wall_s), min(best_pre, pre.wall_s)
            s = tr.valid().clone()
            s[:, 0] = False
            layers = float((tr.counts["layers_run"] + tr.counts["recompute_layers"])[s].mean())
            heads = float(tr.counts["head_checks"][s].mean())
        steps = len(ids) * (n_new - 1)
        return {"batch": len(ids), "wall_s": best, "prefill_s": best_pre,
                "tok_s": steps / max(best - best_pre, 1e-9), "layers": layers, "head_checks": heads}

    def compute():
        if batch == 1:
            return [{"prompt": b, **run([es.ids[b]])} for b in range(len(es))]
        return [{"prompt": -1, **run(es.ids[:batch])}]

    params = {"prompts": es.spec, "n_new": n_new, "rule": rule, "strategy": strategy, "rule_kw": _kw(rule_kw),
              "batch": batch, "repeats": repeats, "threads": torch.get_num_threads()}
    df = store.cached("timing", params, compute, model=lm)
    df.insert(0, "label", label(rule, strategy, rule_kw))
    df.insert(1, "rule", rule)
    df.insert(2, "strategy", strategy)
    return df


def time_replay(lm, es: EvalSet, n_new: int, df: pd.DataFrame, strategy: str, repeats: int = 2) -> pd.DataFrame:
    """Batch-1 decoding speed (cached) of each prompt of ``es`` replaying the exit layers a point
    table ``df`` recorded for it (rule "scripted"), with ``strategy``: the same exits, no exit test.
    Separates what a fill strategy costs in wall time from what the exit rule's checks cost."""
    L = lm.config.num_hidden_layers
    scripts = {int(r["prompt"]): [L] + split_ints(r["exits"])[1:] for _, r in df.iterrows()}

    def compute():
        rows = []
        for b in range(len(es)):
            kw = {"exits": tuple(scripts[b][:n_new])}
            best, best_pre, layers = math.inf, math.inf, 0.0
            for _ in range(repeats):
                pre = generate(lm, [es.ids[b]], 1, rule="full", stop_at_eos=False)
                tr = generate(lm, [es.ids[b]], n_new, rule="scripted", strategy=strategy, rule_kw=kw,
                              stop_at_eos=False)
                best, best_pre = min(best, tr.wall_s), min(best_pre, pre.wall_s)
                s = tr.valid().clone()
                s[:, 0] = False
                layers = float((tr.counts["layers_run"] + tr.counts["recompute_layers"])[s].mean())
            rows.append({"prompt": b, "batch": 1, "wall_s": best, "prefill_s": best_pre,
                         "tok_s": (n_new - 1) / max(best - best_pre, 1e-9), "layers": layers})
        return rows

    params = {"prompts": es.spec, "n_new": n_new, "strategy": strategy, "repeats": repeats,
              "scripts": {str(b): scripts[b][:n_new] for b in range(len(es))}, "threads": torch.get_num_threads()}
    out = store.cached("timing_replay", params, compute, model=lm)
    out.insert(0, "strategy", strategy)
    return out


def spec_point(lm, es: EvalSet, n_new: int, exit_layer: int, draft_len: int, repeats: int = 1,
               peer: bool = True) -> pd.DataFrame:
    """LayerSkip self-speculative decoding at (E, d) on every prompt of ``es`` (cached), timed side by side
    with full-depth decoding (this engine) and, if ``peer``, with transformers'
    ``generate(assistant_early_exit=E)`` at the same draft length: for each prompt and repeat the three run
    back to back, ``n_new`` tokens each without stopping at EOS, and the fastest repeat counts.

    One row per prompt: ``full_s``, ``spec_s``, ``hf_s`` (wall seconds, prompt pass included, the same for
    all three), ``speedup`` (full_s / spec_s), ``vs_hf`` (hf_s / spec_s), ``lossless`` (our tokens equal
    full depth's), ``hf_lossless``, ``acceptance`` (accepted / drafted), ``rounds``, ``tokens_per_round``,
    ``layers`` (decoder-layer evaluations per decoding step, draft + verify, prompt pass excluded as for
    every other method), ``heads`` (head evaluations per decoding step)."""
    from ..engine.speculative import hf_assistant_early_exit, self_speculative

    def compute():
        rows = []
        for b, ids in enumerate(es.ids):
            best = {"full": math.inf, "spec": math.inf, "hf": math.inf}
            for _ in range(repeats):
                full = generate(lm, [ids], n_new, rule="full", stop_at_eos=False)
                best["full"] = min(best["full"], full.wall_s)
                sp = self_speculative(lm, ids, n_new, exit_layer, draft_len, stop_at_eos=False)
                best["spec"] = min(best["spec"], sp.wall_s)
                if peer:
                    hf_tokens, hf_s = hf_assistant_early_exit(lm, ids, n_new, exit_layer, draft_len,
                                                              stop_at_eos=False)
                    best["hf"] = min(best["hf"], hf_s)
            ref = full.sequences()[0]
            rows.append({"prompt": b, "E": exit_layer, "d": draft_len, "n_new": len(sp.tokens),
                         "full_s": best["full"], "spec_s": best["spec"],
                         "hf_s": best["hf"] if peer else float("nan"),
                         "lossless": bool(sp.tokens == ref),
                         "hf_lossless": bool(hf_tokens == ref) if peer else float("nan"),
                         "acceptance": sp.acceptance, "rounds": sp.rounds,
                         "tokens_per_round": (len(sp.tokens) - 1) / max(sp.rounds, 1),
                         # per decoding step, like every other method: the prompt pass (which also
                         # predicts token 0) is left out
                         "layers": (sp.layer_evals - len(ids) * lm.num_layers) / max(len(sp.tokens) - 1, 1),
                         "heads": (sp.head_evals - 1) / max(len(sp.tokens) - 1, 1)})
        return rows

    params = {"prompts": es.spec, "n_new": n_new, "E": exit_layer, "d": draft_len, "repeats": repeats,
              "peer": peer, "threads": torch.get_num_threads()}
    df = store.cached("spec_point", params, compute, model=lm)
    df["speedup"] = df["full_s"] / df["spec_s"]
    df["vs_hf"] = df["hf_s"] / df["spec_s"]
    df["full_tok_s"] = df["n_new"] / df["full_s"]
    df["spec_tok_s"] = df["n_new"] / df["spec_s"]
    df["hf_tok_s"] = df["n_new"] / df["hf_s"]
    return df


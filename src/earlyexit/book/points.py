"""The experiments the chapters call: one decoding configuration measured on a prompt set.

A *point* is (prompt set, tokens to generate, exit rule with its arguments, fill strategy). Running a
point decodes every prompt of the set in one batch and returns a tidy table, one row per prompt:

    consistency with the full model   exact_match, ttd (tokens to first divergence), rouge_full
    quality against the reference     rouge_ref (token ids), ppl_ref (teacher-forced, optional)
    cost                              layers (decoder layers per decoding step, recompute included),
                                      own_layers, recompute_layers, copied_kv, head_checks,
                                      pending_layers (lazy recompute: skipped layers never run),
                                      flop_fraction and effective_layers (earlyexit.metrics.cost_summary)
    what happened                     exit_rate, hole_reads, the tokens and exit layers (space-separated)

Every point goes through the result cache (:mod:`earlyexit.store`): its key holds the point's
parameters, the prompt set's hash, the model's weights hash and the library's code version, so a
chapter that asks for a point another chapter has computed reads it from disk.

Conventions: per-token averages are over the decoding *steps* (generated tokens t >= 1); token 0 is
predicted by the prompt pass, which is the same full-depth pass for every method. Token-level
metrics compare token ids (not words).

    from earlyexit import experiments as ex
    es = ex.eval_set(lm, kind="mix", n=12, seed=0, max_prompt_tokens=96)
    df = ex.point(lm, es, 32, "softmax", "copy-forward", dict(threshold=0.9, min_layer=15))
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from ..engine.loop import generate
from . import metrics, store
from .prompts import EvalSet

IGNORE = -100


def set_threads(n: int) -> int:
    """Use ``n`` CPU threads for torch (0: leave torch's default). Returns the number in use.

    Measured on a shared 2-core machine: with other processes running, one thread decodes up to
    six times faster than two (the second thread spins waiting for a core it does not get).
    """
    if n and n > 0:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def _kw(rule_kw) -> dict:
    """rule_kw as plain data with lists for tuples (so that it hashes and prints the same way)."""
    out = {}
    for k, v in sorted((rule_kw or {}).items()):
        out[k] = list(v) if isinstance(v, tuple) else v
    return out


def _rule_args(rule_kw) -> dict:
    """rule_kw as the engine wants it: tuples for the tuple fields."""
    out = {}
    for k, v in (rule_kw or {}).items():
        out[k] = tuple(v) if isinstance(v, list) else v
    return out


def _join(xs) -> str:
    return " ".join(str(int(x)) for x in xs)


def split_ints(s) -> list[int]:
    """The inverse of the space-separated id strings stored in the tables."""
    if isinstance(s, float) and math.isnan(s):
        return []
    return [int(x) for x in str(s).split()] if str(s).strip() else []


def label(rule: str, strategy: str, rule_kw=None) -> str:
    kw = rule_kw or {}
    if rule == "static":
        return f"static@{kw.get('layer')}"
    if rule == "skipdecode":
        return f"skipdecode {kw.get('e_max')}->{kw.get('e_min')}"
    if "threshold" in kw:
        return f"{rule} {kw['threshold']:g} / {strategy}"
    return f"{rule} / {strategy}"


def full_depth(lm, es: EvalSet, n_new: int) -> pd.DataFrame:
    """The full model's greedy output for every prompt (cached): columns prompt, n_gen, tokens."""
    def compute():
        tr = generate(lm, es.ids, n_new, rule="full")
        return [{"prompt": b, "n_gen": int(tr.n_new[b]), "tokens": _join(tr.sequences()[b])}
                for b in range(len(es))]

    return store.cached("full_depth", {"prompts": es.spec, "n_new": n_new}, compute, model=lm)


def _forced_refs(es: EvalSet, n_new: int, pad_id: int):
    """(force ids, targets) for teacher forcing the references; IGNORE where there is none."""
    B = len(es)
    force = torch.full((B, n_new), pad_id, dtype=torch.long)
    target = torch.full((B, n_new), IGNORE, dtype=torch.long)
    for b, ref in enumerate(es.refs):
        if ref:
            r = torch.tensor(ref[:n_new])
            force[b, : len(r)] = r
            target[b, : len(r)] = r
    return force, target


def trace_frame(lm, es: EvalSet, tr, full: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per-prompt metrics of one trace (see the module docstring for the columns)."""
    cfg = lm.config
    L = cfg.num_hidden_layers
    B, N = tr.tokens.shape
    valid = tr.valid()
    steps = valid.clone()
    steps[:, 0] = False
    c = {k: v.float() for k, v in tr.counts.items()}
    pending = np.zeros(B)
    eng = tr.meta.get("engine")
    if eng is not None and hasattr(eng.strategy, "pending"):
        for b in range(B):
            pending[b] = sum(L - lev for lev, _, _ in eng.strategy.pending[b].values())
    seqs = tr.sequences()
    rows = []
    for b in range(B):
        s = steps[b]
        n_steps = int(s.sum())
        row = {"prompt": b, "prompt_id": es.prompts[b].id, "kind": es.prompts[b].kind,
               "prompt_len": len(es.ids[b]), "n_gen": int(tr.n_new[b]), "n_steps": n_steps}
        if n_steps:
            run, rec = c["layers_run"][b, s].numpy(), c["recompute_layers"][b, s].numpy()
            cp, hd = c["copied_kv"][b, s].numpy(), c["head_checks"][b, s].numpy()
            t = torch.arange(N)[s].numpy()
            ctx = len(es.ids[b]) + t            # keys a step attends to: prompt + earlier tokens + itself
            cost = metrics.cost_summary(run, rec, cp, hd, cfg, ctx)
            ex = tr.exit_layer[b, s].numpy()
            row.update(layers=float((run + rec).mean()), own_layers=float(run.mean()),
                       recompute_layers=float(rec.mean()), copied_kv=float(cp.mean()),
                       head_checks=float(hd.mean()), exit_rate=float((ex < L).mean()),
                       exit_layer=float(ex.mean()), hole_reads=float(c["hole_reads"][b, s].mean()),
                       pending_layers=float(pending[b] / n_steps), flop_fraction=cost["flop_fraction"],
                       effective_layers=cost["effective_layers"])
        else:
            row.update({k: float("nan") for k in ("layers", "own_layers", "recompute_layers", "copied_kv",
                                                    "head_checks", "exit_rate", "exit_layer", "hole_reads",
                                                    "pending_layers", "flop_fraction", "effective_layers")})
        if full is not None:
            ref_full = split_ints(full.loc[full["prompt"] == b, "tokens"].iloc[0])
            row.update(exact_match=metrics.exact_match(seqs[b], ref_full),
                       ttd=metrics.tokens_to_divergence(seqs[b], ref_full),
                       rouge_full=metrics.textual_consistency(seqs[b], ref_full))
        ref = es.refs[b]
        row["rouge_ref"] = metrics.rouge_l(seqs[b], ref[: N]) if ref else float("nan")
        row["tokens"] = _join(seqs[b])
        row["exits"] = _join(tr.exit_layer[b, : int(tr.n_new[b])].tolist())
        rows.append(row)
    return pd.DataFrame(rows)


def run_point(lm, es: EvalSet, n_new: int, rule: str = "full", strategy: str = "naive-mask",
              rule_kw=None, with_ppl: bool = False, full: pd.DataFrame | None = None) -> pd.DataFrame:
    """Decode ``es`` with (rule, strategy) and measure it (uncached; see :func:`point`)."""
    if full is None:
        full = full_depth(lm, es, n_new)
    tr = generate(lm, es.ids, n_new, rule=rule, strategy=strategy, rule_kw=_rule_args(rule_kw))
    df = trace_frame(lm, es, tr, full)
    df["batch_tok_s"] = float(tr.n_new.sum()) / tr.wall_s
    df["wall_s"] = tr.wall_s
    if with_ppl:
        pad_id = lm.config.pad_token_id if lm.config.pad_token_id is not None else 0
        force, target = _forced_refs(es, n_new, pad_id)
        tf = generate(lm, es.ids, n_new, rule=rule, strategy=strategy, rule_kw=_rule_args(rule_kw),
                      force=force, return_logits=True, stop_at_eos=False)
        ppl = []
        for b in range(len(es)):
            keep = target[b] != IGNORE
            ppl.append(metrics.perplexity(tf.logits[b, keep], target[b, keep]) if keep.any() else float("nan"))
        df["ppl_ref"] = ppl
        # the cost of the teacher-forced pass, so that quality and cost can be read from the same run
        df["layers_tf"] = trace_frame(lm, es, tf)["layers"]
    df.insert(1, "rule", rule)
    df.insert(2, "strategy", strategy)
    df.insert(3, "label", label(rule, strategy, rule_kw))
    kw = rule_kw or {}
    df.insert(4, "threshold", float(kw.get("threshold", float("nan"))))
    df.insert(5, "rule_kw", store.canonical(_kw(rule_kw)))
    return df


def point(lm, es: EvalSet, n_new: int, rule: str = "full", strategy: str = "naive-mask", rule_kw=None,
          with_ppl: bool = False) -> pd.DataFrame:
    """:func:`run_point` through the result cache."""
    params = {"prompts": es.spec, "n_new": n_new, "rule": rule, "strategy": strategy,
              "rule_kw": _kw(rule_kw), "with_ppl": with_ppl}
    return store.cached("point", params, lambda: run_point(lm, es, n_new, rule, strategy, rule_kw, with_ppl),
                        model=lm)


def sweep(lm, es: EvalSet, n_new: int, configs, ppl_for=(), progress: bool = True) -> pd.DataFrame:
    """:func:`point` for each config (a dict with rule, strategy, rule_kw), concatenated.

    ``ppl_for``: the configs (their :func:`label`) whose reference perplexity is measured as well
    (a second, teacher-forced pass), or True for all of them.
    """
    from tqdm.auto import tqdm

    frames = []
    configs = list(configs)
    for cfg in tqdm(configs, desc="points", disable=not (progress and store._progress_enabled()), leave=False):
        rule, strategy, kw = cfg.get("rule", "full"), cfg.get("strategy", "naive-mask"), cfg.get("rule_kw")
        ppl = ppl_for is True or label(rule, strategy, kw) in set(ppl_for or ())
        frames.append(point(lm, es, n_new, rule, strategy, kw, with_ppl=ppl))
    return pd.concat(frames, ignore_index=True)


def threshold_configs(rule: str, thresholds, strategies, **rule_kw) -> list[dict]:
    """The grid thresholds × strategies for one thresholded rule (extra rule arguments shared)."""
    return [{"rule": rule, "strategy": s, "rule_kw": {**rule_kw, "threshold": float(t)}}
            for s in strategies for t in thresholds]


def summary(df: pd.DataFrame, by, values=("layers", "rouge_full", "exact_match"), seed: int = 0,
            n_boot: int = 2000) -> pd.DataFrame:
    """Mean and 95% bootstrap interval over prompts of each value, per group (wide: v, v_lo, v_hi)."""
    by = [by] if isinstance(by, str) else list(by)
    out = None
    for v in values:
        s = metrics.summarize(df, by, v, n_boot=n_boot, seed=seed).rename(
            columns={"mean": v, "lo": f"{v}_lo", "hi": f"{v}_hi", "n": f"{v}_n"})
        out = s if out is None else out.merge(s, on=by)
    return out


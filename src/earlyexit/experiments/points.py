"""The experiments the chapters call: one decoding configuration measured on a prompt set.

A *point* is (prompt set, tokens to generate, a :class:`~earlyexit.engine.DecodeConfig`: an exit rule with
its arguments and a fill strategy). Running a point decodes every prompt of the set in one batch and returns
a tidy table, one row per prompt:

    consistency with the full model   exact_match, ttd (tokens to first divergence), rouge_full
    quality against the reference     rouge_ref (token ids), ppl_ref (teacher-forced, optional)
    cost                              layers (decoder layers per decoding step, recompute included),
                                      own_layers, recompute_layers, copied_kv, head_checks,
                                      pending_layers (lazy recompute: skipped layers never run),
                                      flop_fraction and effective_layers (earlyexit.experiments.metrics.cost_summary)
    what happened                     exit_rate, hole_reads, the tokens and exit layers (space-separated)

Every point goes through the result cache (:mod:`earlyexit.store.results`): its key holds the point's
configuration, the prompt set's hash, the model's weights hash and the library's code version, so a
chapter that asks for a point another chapter has computed reads it from disk.

Conventions: per-token averages are over the decoding *steps* (generated tokens t >= 1); token 0 is
predicted by the prompt pass, which is the same full-depth pass for every method. Token-level
metrics compare token ids (not words).

    from earlyexit.engine import DecodeConfig
    es = evalset.eval_set(lm, kind="mix", n=12, seed=0, max_prompt_tokens=96)
    df = points.point(lm, es, 32, DecodeConfig.early_exit("softmax", "copy-forward", threshold=0.9, min_layer=15))
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import torch

from ..engine import DecodeConfig, Result, decode
from . import metrics
from .. import store
from ..files import canonical
from ..store import workers
from .evalset import EvalSet

IGNORE = -100


def default_min_layer(min_layer: int, L: int) -> int:
    """The lowest layer a confidence rule may exit at: ``min_layer``, or half the depth when it is 0."""
    return min(min_layer or L // 2, L)


def _join(xs) -> str:
    return " ".join(str(int(x)) for x in xs)


def split_ints(s) -> list[int]:
    """The inverse of the space-separated id strings stored in the tables."""
    if isinstance(s, float) and math.isnan(s):
        return []
    return [int(x) for x in str(s).split()] if str(s).strip() else []


def full_depth(lm, es: EvalSet, n_new: int) -> pd.DataFrame:
    """The full model's greedy output for every prompt (cached): columns prompt, n_gen, tokens."""
    def compute():
        tr = decode(lm, es.ids, DecodeConfig.full(), n_new)
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


def frame(lm, es: EvalSet, tr: Result, full: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per-prompt metrics of one decoding result (see the module docstring for the columns)."""
    cfg = lm.config
    L = cfg.num_hidden_layers
    B, N = tr.tokens.shape
    valid = tr.valid()
    steps = valid.clone()
    steps[:, 0] = False
    c = {k: v.float() for k, v in tr.counts.items()}
    pending = tr.pending.numpy() if tr.pending is not None else np.zeros(B)
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


def run_point(lm, es: EvalSet, n_new: int, cfg: DecodeConfig, with_ppl: bool = False,
              full: pd.DataFrame | None = None) -> pd.DataFrame:
    """Decode ``es`` with ``cfg`` and measure it (uncached; see :func:`point`)."""
    if full is None:
        full = full_depth(lm, es, n_new)
    tr = decode(lm, es.ids, cfg, n_new)
    df = frame(lm, es, tr, full)
    df["batch_tok_s"] = float(tr.n_new.sum()) / tr.wall_s
    df["wall_s"] = tr.wall_s
    df["calls"] = json.dumps(tr.meta["calls"], sort_keys=True, separators=(",", ":"))
    if with_ppl:
        pad_id = lm.config.pad_token_id if lm.config.pad_token_id is not None else 0
        force, target = _forced_refs(es, n_new, pad_id)
        tf = decode(lm, es.ids, cfg, n_new, force=force, return_logits=True, stop_at_eos=False)
        ppl = []
        for b in range(len(es)):
            keep = target[b] != IGNORE
            ppl.append(metrics.perplexity(tf.logits[b, keep], target[b, keep]) if keep.any() else float("nan"))
        df["ppl_ref"] = ppl
        # the cost of the teacher-forced pass, so that quality and cost can be read from the same run
        df["layers_tf"] = frame(lm, es, tf)["layers"]
    describe(df, cfg)
    return df


def describe(df: pd.DataFrame, cfg: DecodeConfig) -> pd.DataFrame:
    """Insert the configuration's columns (rule, strategy, label, threshold, rule_kw) after ``prompt``."""
    cols = cfg.columns()
    df.insert(1, "rule", cols["rule"])
    df.insert(2, "strategy", cols["strategy"])
    df.insert(3, "label", cfg.label)
    df.insert(4, "threshold", cfg.threshold)
    df.insert(5, "rule_kw", canonical(cfg.key().get("rule_kw", {})))
    return df


def point_params(es: EvalSet, n_new: int, cfg: DecodeConfig, **extra) -> dict:
    """The result-cache parameters of a point (one place, so that every reader asks for the same entry)."""
    return {"prompts": es.spec, "n_new": n_new, **cfg.key(), **extra}


def point(lm, es: EvalSet, n_new: int, cfg: DecodeConfig, with_ppl: bool = False) -> pd.DataFrame:
    """:func:`run_point` through the result cache."""
    return store.cached("point", point_params(es, n_new, cfg, with_ppl=with_ppl),
                        lambda: run_point(lm, es, n_new, cfg, with_ppl), model=lm)


def sweep(lm, es: EvalSet, n_new: int, configs, ppl_for=(), progress: bool = True) -> pd.DataFrame:
    """:func:`point` for each DecodeConfig of ``configs``, concatenated.

    ``ppl_for``: the configs (or their labels) whose reference perplexity is measured as well (a second,
    teacher-forced pass), or True for all of them. In a worker of a distributed sweep the worker's share
    of the configs is computed first (:func:`earlyexit.store.workers.each`).
    """
    from ..progress import bar

    wanted = set(ppl_for or ()) if ppl_for is not True else set()
    configs = list(configs)
    pbar = bar(total=len(configs), show=progress, desc="points", leave=False)

    def one(cfg):
        ppl = ppl_for is True or cfg in wanted or cfg.label in wanted
        df = point(lm, es, n_new, cfg, with_ppl=ppl)
        pbar.update(1)
        return df

    try:
        frames = workers.each(configs, one)
    finally:
        pbar.close()
    return pd.concat(frames, ignore_index=True)


def threshold_configs(rule: str, thresholds, strategies, **rule_kw) -> list[DecodeConfig]:
    """The grid thresholds × strategies for one thresholded rule (extra rule arguments shared)."""
    return [DecodeConfig.early_exit(rule, s, **rule_kw, threshold=float(t)) for s in strategies for t in thresholds]


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


"""Batched speed over several groups of prompts, so that a batch's interval is over groups, like batch 1's is
over prompts.

A batch of ``B`` prompts decoded together is one sample: timed alone (:func:`earlyexit.experiments.timing.time_point`
at ``batch=B``), its interval comes from its rounds, and two timing runs of one commit put chapter 5's SkipDecode at
batch 8 at 1.1x [1.0, 1.3] and 1.15x [1.11, 1.20], one round of the first an outlier. Here each of ``groups``
disjoint groups of ``B`` prompts is timed as a batch (each group's ratio is the median over its rounds, which an
outlier round does not move) and the interval is the t-interval over the groups.

    sets = grouped.batch_sets(lm, es, [1, 8], groups=3, single=es.subset(6))   # batch -> the prompts it times
    t = grouped.time_groups(lm, sets[8], n_new, cfg, batch=8, repeats=3)      # a row per group
    speeds.speed(t)                                                           # interval over the 3 groups

Each group is one :func:`~earlyexit.experiments.timing.time_point` entry of the result cache, so the timing code
and its keys are :mod:`~earlyexit.experiments.timing`'s: two chapters that time the same batch share it.
"""
from __future__ import annotations

import pandas as pd

from . import timing
from .evalset import EvalSet, eval_set


def batch_sets(lm, es: EvalSet, sizes, groups: int, single: EvalSet) -> dict[int, EvalSet]:
    """The prompts timed at each batch size of ``sizes``: ``single`` (prompts timed one by one) at batch 1; at a
    batch ``B`` above 1, ``groups`` disjoint groups of ``B``: an evaluation set of ``B * groups`` prompts drawn as
    ``es`` was (its kind, seed and prompt length), so that every chapter timing batch ``B`` times the same prompts."""
    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups (disjoint groups of prompts per batch size) must be an int >= 1, got {groups!r}")
    bad = [b for b in sizes if not isinstance(b, int) or b < 1]
    if bad:
        raise ValueError(f"batch sizes must be ints >= 1, got {bad}")
    spec = es.spec
    return {B: single if B == 1 else eval_set(lm, spec["kind"], B * groups, spec["seed"], spec["max_prompt_tokens"])
            for B in sorted(set(sizes))}


def time_groups(lm, es: EvalSet, n_new: int, cfg, batch: int, repeats: int) -> pd.DataFrame:
    """``cfg`` timed in turn with full depth at ``batch``: at batch 1 :func:`~earlyexit.experiments.timing.time_point`
    over the prompts of ``es`` one by one; above, each of the ``len(es) // batch`` disjoint groups of ``batch``
    consecutive prompts decoded together (one cached ``time_point`` each, its rounds at least
    :data:`~earlyexit.experiments.timing.BATCH_ROUNDS`), one row per group with its index in ``group``.
    :func:`earlyexit.experiments.speeds.speed` of the rows is then the t-interval over groups."""
    if batch == 1:
        return timing.time_point(lm, es, n_new, cfg, batch=1, repeats=repeats)
    if not isinstance(batch, int) or batch < 1 or len(es) < batch:
        raise ValueError(f"batch must be an int in [1, {len(es)}] (the prompts in the set), got {batch!r}")
    parts = [timing.time_point(lm, es.part(g * batch, (g + 1) * batch), n_new, cfg, batch=batch, repeats=repeats)
             .assign(group=g) for g in range(len(es) // batch)]
    return pd.concat(parts, ignore_index=True)

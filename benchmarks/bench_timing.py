"""How precise a paired ratio is: full depth timed against itself (A/A), two estimators side by side.

The book's timing protocol (``earlyexit.experiments.timing``) alternates a method and full depth prompt by
prompt for a few rounds. Here both arms are full depth, so every ratio's truth is 1.0 and its spread is the
protocol's noise alone. Over the same rounds the benchmark reads each prompt's ratio two ways: the median of
the rounds' ratios of whole-decode times (the protocol before the step floor) and the ratio of the two arms'
step floors (each decoding step's fastest time over the rounds, summed: ``timing.step_floor``). It prints, per
block of prompts and over all blocks, the standard deviation of the per-prompt log ratio of each and their
ratio (below 1: the floor is the more precise).

    python benchmarks/bench_timing.py [--model smollm2-135m] [--prompts 6] [--rounds 3] [--tokens 32] [--blocks 2]
"""
from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from earlyexit.engine import DecodeConfig
from earlyexit.engine.models import load_model
from earlyexit.experiments.evalset import eval_set
from earlyexit.experiments.timing import _alternate


def block(lm, groups, n_new: int, rounds: int):
    full = DecodeConfig.full()
    rows = _alternate(lm, groups, n_new, full, full, rounds)
    med, floor = [], []
    for g in range(len(groups)):
        mine = [r for r in rows if r["group"] == g]
        med.append(math.log(float(np.median([r["ref_s"] / r["method_s"] for r in mine]))))
        floor.append(math.log(mine[0]["ref_floor_s"] / mine[0]["method_floor_s"]))
    return np.array(med), np.array(floor)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    if a.prompts < 2 or a.rounds < 1 or a.tokens < 2 or a.blocks < 1 or a.threads < 1:
        ap.error("--prompts >= 2, --rounds >= 1, --tokens >= 2, --blocks >= 1, --threads >= 1")
    torch.set_num_threads(a.threads)
    lm = load_model(a.model)
    es = eval_set(lm, "mix", a.prompts, 0, 96)
    groups = [[ids] for ids in es.ids]
    print(f"A/A: full depth against itself, {a.prompts} prompts x {a.rounds} rounds, {a.tokens} tokens, "
          f"{a.threads} thread(s); sd of the per-prompt log ratio (truth: 0)")
    print(f"{'block':>5} {'median of rounds %':>19} {'step floor %':>13} {'floor / median':>15}")
    all_m, all_f = [], []
    for b in range(a.blocks):
        m, f = block(lm, groups, a.tokens, a.rounds)
        all_m.append(m), all_f.append(f)
        sm, sf = 100 * m.std(ddof=1), 100 * f.std(ddof=1)
        print(f"{b:>5} {sm:>19.2f} {sf:>13.2f} {sf / sm:>15.2f}")
    m, f = np.concatenate(all_m), np.concatenate(all_f)
    sm, sf = 100 * m.std(ddof=1), 100 * f.std(ddof=1)
    print(f"{'all':>5} {sm:>19.2f} {sf:>13.2f} {sf / sm:>15.2f}")
    print(f"mean log ratio: median of rounds {100 * m.mean():+.2f}%, step floor {100 * f.mean():+.2f}%")


if __name__ == "__main__":
    main()

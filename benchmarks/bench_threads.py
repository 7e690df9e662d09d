"""Threads against a shared machine: decoding and a training step, quiet and next to one busy process.

For each thread count (1, 2, ..., and what ``threads: auto`` resolves to) the benchmark times batch-1 greedy
decoding (tokens/s, full depth) and one training step of the LayerSkip recipe at the profile's chapter-6 batch,
first on a quiet machine, then while one competing process spins on one core. It prints the times side by side
and each condition's best thread count: the evidence behind the profiles' thread settings.

    python benchmarks/bench_threads.py [--profile cpu] [--threads 1 2] [--tokens 32] [--steps 2]
"""
from __future__ import annotations

import argparse
import statistics

import torch
from contention import CONDITIONS, condition

from earlyexit.book import runner
from earlyexit.corpus import encode, load_prompts
from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.models import load_model
from earlyexit.engine.threads import resolve_threads
from earlyexit.training.checkpoints import Batches
from earlyexit.training.loop import train
from earlyexit.training.recipe import TrainConfig


def measure(lm, ids, n_tokens: int, cfg: TrainConfig, reps: int) -> tuple[float, float]:
    full = DecodeConfig.full()
    decode(lm, [ids], full, 4, stop_at_eos=False)                                  # warm-up
    tok_s = statistics.median(n_tokens / decode(lm, [ids], full, n_tokens, stop_at_eos=False).wall_s
                              for _ in range(reps))
    model = load_model(lm.spec, device="cpu", dtype=torch.float32).model
    h = train(model, Batches(lm.tokenizer, cfg.batch_size, cfg.seq_len, 0), cfg, progress=False)
    return tok_s, statistics.median(h["seconds"][1:] or h["seconds"])              # the first step warms up


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--threads", type=int, nargs="+", default=None, help="thread counts (default: 1 .. auto)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3, help="training steps timed (the first is a warm-up)")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    P6 = runner.load_profile(a.profile).parameters("06_training")
    auto, why = resolve_threads("auto")
    counts = a.threads or list(range(1, auto + 1))
    lm = load_model(P6["model"], device="cpu")
    ids = encode(load_prompts("code", 1, seed=0, tokenizer=lm.tokenizer), lm.tokenizer, max_prompt_tokens=64)[0]
    cfg = TrainConfig(steps=a.steps, batch_size=P6["batch_size"], seq_len=P6["seq_len"], lr=P6["lr"], warmup=1,
                      p_max=P6["p_max"], e_scale=P6["e_scale"], curriculum=P6["curriculum"],
                      curriculum_param=P6["curriculum_param"], seed=0)
    print(f"model={lm.spec} auto={auto} ({why}); decode: batch 1, {a.tokens} tokens; training step: "
          f"{cfg.batch_size} x {cfg.seq_len} tokens")
    print(f"{'condition':<22} {'threads':>7} {'decode tok/s':>13} {'train s/step':>13}")
    results = {}
    for cond in CONDITIONS:
        with condition(cond):
            n_auto, why = resolve_threads("auto")
            print(f"{cond:<22} threads: auto resolves to {n_auto} ({why})", flush=True)
            for n in counts:
                torch.set_num_threads(n)
                results[cond, n] = measure(lm, ids, a.tokens, cfg, a.reps)
                print(f"{cond:<22} {n:>7} {results[cond, n][0]:13.1f} {results[cond, n][1]:13.2f}", flush=True)
    for cond in CONDITIONS:
        d = max(counts, key=lambda n: results[cond, n][0])
        t = min(counts, key=lambda n: results[cond, n][1])
        print(f"best under '{cond}': decoding {d} thread(s), training {t} thread(s)")


if __name__ == "__main__":
    main()

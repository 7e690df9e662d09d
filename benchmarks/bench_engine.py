"""Engine full depth vs HF ``generate`` greedy: same model, prompts, dtype, batch 1; interleaved
runs after a warm-up; prints tokens/s of each and the ratio (goal: engine >= 1.0x).

    python benchmarks/bench_engine.py [--model smollm2-135m] [--prompts 6] [--tokens 64] [--reps 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from earlyexit.corpus import encode, load_prompts
from earlyexit.engine.loop import generate
from earlyexit.engine.models import load_model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="auto")
    a = ap.parse_args()
    lm = load_model(a.model, device=a.device)
    ps = encode(load_prompts("mix", a.prompts, seed=0, tokenizer=lm.tokenizer, max_prompt_tokens=96),
                lm.tokenizer, 96)
    dev = lm.device

    def ours(ids):
        t = time.perf_counter()
        generate(lm, [ids], a.tokens, stop_at_eos=False)
        return time.perf_counter() - t

    def hf(ids):
        x = torch.tensor([ids], device=dev)
        t = time.perf_counter()
        with torch.inference_mode():
            lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=a.tokens,
                              min_new_tokens=a.tokens, do_sample=False, pad_token_id=2)
        return time.perf_counter() - t

    ours(ps[0]), hf(ps[0])  # warm-up
    t_ours, t_hf = [], []
    for r in range(a.reps):
        for ids in ps:  # interleaved, alternating which goes first
            pair = (ours, hf) if r % 2 == 0 else (hf, ours)
            res = {f.__name__: f(ids) for f in pair}
            t_ours.append(res["ours"])
            t_hf.append(res["hf"])
    n = a.tokens
    tps_o = n / statistics.median(t_ours)
    tps_h = n / statistics.median(t_hf)
    print(f"model={a.model} device={dev} threads={torch.get_num_threads()} prompts={len(ps)} "
          f"tokens={n} reps={a.reps}")
    print(f"engine full depth: {tps_o:.1f} tok/s   HF generate: {tps_h:.1f} tok/s   "
          f"ratio engine/HF = {tps_o / tps_h:.2f}x (median over {len(t_ours)} runs each)")


if __name__ == "__main__":
    main()

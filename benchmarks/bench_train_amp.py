"""Does bfloat16 autocast speed up a training step on this CPU, and do the losses stay within noise?

Times the cpu profile's continual-pre-training step (early-exit loss with layer dropout, backward, AdamW) on
the embedded model in float32 and under ``torch.autocast("cpu", dtype=torch.bfloat16)``, interleaved, from the
same weights and the same batches, and prints the median step time of each, their ratio, and the largest
difference between the two runs' losses over the steps, next to the noise it is to be judged against: the largest
difference between two float32 runs whose layer-dropout coins differ (another seed), everything else equal. The weights and the optimizer state stay float32 in
both (autocast changes the matrix products only).

The training loop keeps freed memory for reuse (:mod:`earlyexit.alloc`), and so does this benchmark;
``--default-allocator`` times the steps with glibc's default instead (each large tensor a fresh mmap whose pages
fault in again), and the minor page faults of the run are printed.

    python benchmarks/bench_train_amp.py [--model smollm2-135m] [--steps 3] [--batch 4] [--seq 256] [--threads auto]
                                         [--default-allocator]
"""
from __future__ import annotations

import argparse
import copy
import resource
import statistics
import time

import torch

from earlyexit.alloc import retain_freed_memory
from earlyexit.corpus import token_stream
from earlyexit.engine.models import load_model
from earlyexit.engine.threads import resolve_threads
from earlyexit.training.forward import early_exit_loss
from earlyexit.training.recipe import curriculum_layers, exit_loss_weights, layer_dropout_rates


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", default="auto")
    ap.add_argument("--default-allocator", action="store_true", help="glibc's default: freed memory goes back")
    a = ap.parse_args()
    kept = False if a.default_allocator else retain_freed_memory()
    torch.set_num_threads(resolve_threads(a.threads if a.threads == "auto" else int(a.threads))[0])
    lm = load_model(a.model)
    L = lm.num_layers
    stream = token_stream(lm.tokenizer, a.seq, seed=0)
    batches = [torch.stack([next(stream) for _ in range(a.batch)]) for _ in range(a.steps)]
    models = {"float32": lm.model, "bfloat16 autocast": copy.deepcopy(lm.model),
              "float32, other dropout seed": copy.deepcopy(lm.model)}
    for m in models.values():
        m.train()                          # layer dropout on, as in training
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    rates = layer_dropout_rates(L, 0.1)
    times = {k: [] for k in models}
    losses = {k: [] for k in models}
    for step, ids in enumerate(batches):
        layers = curriculum_layers("rotational", step, L, 8)
        weights = exit_loss_weights(layers, L, "sum", 0.1)
        for k in (list(models) if step % 2 == 0 else list(models)[::-1]):
            m, opt = models[k], opts[k]
            gen = torch.Generator().manual_seed(step + (10_000 if "seed" in k else 0))
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=k.startswith("bfloat16")):
                loss, _ = early_exit_loss(m, ids, layers, weights, drop_rates=rates, generator=gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            times[k].append(time.perf_counter() - t0)
            losses[k].append(float(loss.detach()))
    f, b = (statistics.median(times[k]) for k in list(models)[:2])
    diff = max(abs(x - y) for x, y in zip(losses["float32"], losses["bfloat16 autocast"]))
    noise = max(abs(x - y) for x, y in zip(losses["float32"], losses["float32, other dropout seed"]))
    print(f"model={a.model} threads={torch.get_num_threads()} batch={a.batch}x{a.seq} steps={a.steps}")
    print(f"allocator: {'freed memory kept for reuse (earlyexit.alloc)' if kept else 'glibc default'}; minor page "
          f"faults of the run {resource.getrusage(resource.RUSAGE_SELF).ru_minflt:,}")
    for k in models:
        print(f"{k:>18}: median step {statistics.median(times[k]):.2f} s, losses "
              + ", ".join(f"{x:.4f}" for x in losses[k]))
    print(f"bfloat16 autocast / float32 step time = {b / f:.2f} ({'faster' if b < f else 'slower'}); "
          f"largest loss difference {diff:.4f}; float32 with other dropout coins differs by up to {noise:.4f} "
          f"({'within' if diff <= noise else 'outside'} that noise)")


if __name__ == "__main__":
    main()

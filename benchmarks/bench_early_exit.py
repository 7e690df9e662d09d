"""Token-level early exit against full depth at batch 1, side by side in one run, on the LayerSkip-trained model.

For each method (an exit rule with a fill strategy) the benchmark decodes the same prompts at batch 1,
interleaved with full-depth decoding of the same prompt, after a warm-up, and prints the median tokens/s of
both, their ratio, and the method's consistency with full depth (ROUGE-L of the token ids). The goal it checks:
at least one method faster than full depth (1.2x is the target) at a consistency of at least 0.9.

The methods are the book's: the exit classifier of chapter 9 (which decides without reading the head) with
lazy recompute and with copy-forward at a few thresholds, and the softmax rule for reference. The trained
model and the classifier come from the profile's chapters 6 and 9 (trained first if missing).

    python benchmarks/bench_early_exit.py [--profile cpu] [--model trained|released] [--prompts 6] [--tokens 32]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from earlyexit.experiments import classify, metrics, points, evalset, trained
from earlyexit.book import handoff, runner
from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.models import load_model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--model", default="trained", choices=("trained", "released"))
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.5, 0.8, 0.95])
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    P = runner.load_profile(a.profile).parameters("09_where_time_goes")
    lm = handoff.load_trained(P, "layerskip") if a.model == "trained" else load_model(P["model"], device=P["device"])
    es = evalset.eval_set(lm, P["prompt_kind"], a.prompts, P["seed"] + 7, P["max_prompt_tokens"])
    folder = classify.classifier_for(lm, P)
    ml = points.default_min_layer(P["min_layer"], lm.num_layers)
    EE = DecodeConfig.early_exit
    methods = {f"classifier {t:g} / {s}": EE("classifier", s, classifier=folder, min_layer=ml, threshold=t)
               for s in ("lazy-recompute", "copy-forward") for t in a.thresholds}
    methods[f"softmax {P['operating_threshold']:g} / lazy-recompute"] = EE(
        "softmax", "lazy-recompute", min_layer=ml, threshold=P["operating_threshold"])
    full = DecodeConfig.full()
    N = a.tokens
    decode(lm, [es.ids[0]], full, N, stop_at_eos=False)       # warm-up
    print(f"model={a.model} ({lm.spec}) threads={torch.get_num_threads()} prompts={len(es)} tokens={N} reps={a.reps}")
    print(f"{'method':<40} {'tok/s':>7} {'full':>7} {'ratio':>6} {'consistency':>11}")
    best = None
    for name, cfg in methods.items():
        t_m, t_f, cons = [], [], []
        for r in range(a.reps):
            for ids in es.ids:                                  # interleaved, alternating which goes first
                runs = [("m", cfg), ("f", full)] if r % 2 == 0 else [("f", full), ("m", cfg)]
                got = {k: decode(lm, [ids], c, N, stop_at_eos=False) for k, c in runs}
                t_m.append(got["m"].wall_s)
                t_f.append(got["f"].wall_s)
                if r == 0:
                    cons.append(metrics.rouge_l(got["m"].sequences()[0], got["f"].sequences()[0]))
        tm, tf = N / statistics.median(t_m), N / statistics.median(t_f)
        c = statistics.mean(cons)
        print(f"{name:<40} {tm:7.1f} {tf:7.1f} {tm / tf:5.2f}x {c:11.2f}")
        if c >= 0.9 and (best is None or tm / tf > best[1]):
            best = (name, tm / tf, c)
    if best is None:
        print("goal: no method keeps a consistency of 0.9")
    else:
        verdict = "meets the 1.2x target" if best[1] >= 1.2 else ("faster than full depth" if best[1] > 1 else
                                                                    "not faster than full depth")
        print(f"goal: best at consistency >= 0.9 is {best[0]} at {best[1]:.2f}x full depth ({verdict})")


if __name__ == "__main__":
    main()

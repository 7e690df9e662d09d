"""Self-speculative decoding against full depth and transformers' peer at batch 1, side by side in one run.

On the LayerSkip-trained model of the profile's chapter 6, each configuration decodes the same prompts one at a
time, interleaved with full-depth decoding of the same prompt (alternating which goes first), after a
warm-up: our self-speculation with the full draft head, with the shortlist head (FR-Spec), with adaptive draft
length, the training-free layer-skipping drafter (``--skip`` layers left out, chosen as in chapter 7; at d and,
over the shortlist head, at ``--skip-draft``), and
transformers' ``generate(assistant_early_exit=E)`` at the same (E, d), economize's drafters (``early_exit``, its
``frspec`` shortlist over the same K tokens, ``layer_skip`` over the same layers), and plain transformers
``generate`` (full depth). It prints the median tokens/s of each, its ratio to full depth, acceptance, and whether
every output equals full depth's. The goals it checks (issue "self-speculation that pays"): ours at least 1.0x full
depth (1.5x the target), at least 1.3x the transformers peer, and our best against economize's fastest lossless
technique.

    python benchmarks/bench_selfspec.py [--profile cpu] [--exit-layer 25] [--draft 2] [--shortlist 8192] [--skip 8]
                                        [--skip-draft 1] [--prompts 4]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from earlyexit.experiments import probes, evalset, trained
from earlyexit.book import handoff, runner
from earlyexit.engine import DecodeConfig, decode


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--exit-layer", type=int, default=None, help="draft depth E (default: the profile's middle one)")
    ap.add_argument("--draft", type=int, default=2, help="draft length d")
    ap.add_argument("--shortlist", type=int, default=8192, help="rows of the shortlist draft head")
    ap.add_argument("--confidence", type=float, default=0.5, help="adaptive draft length's confidence")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip", type=int, default=8, help="layers the training-free drafter leaves out (0: none)")
    ap.add_argument("--skip-draft", type=int, default=1, help="draft length of the layer-skipping drafter over the "
                    "shortlist head")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    P = runner.load_profile(a.profile).parameters("07_self_speculative")
    lm = handoff.load_trained(P, "layerskip")
    L = lm.num_layers
    E = a.exit_layer or sorted(P["exit_layers"])[len(P["exit_layers"]) // 2]
    if not 1 <= E < L:
        raise SystemExit(f"error: --exit-layer must be in [1, {L - 1}] for this model, got {E}")
    es = evalset.eval_set(lm, P["prompt_kind"], a.prompts, P["seed"] + 11, P["max_prompt_tokens"])
    d, N = a.draft, a.tokens
    SS = DecodeConfig.self_speculation
    methods = {f"self-spec E={E} d={d}": SS(E, d),
               f"self-spec E={E} d={d} K={a.shortlist}": SS(E, d, shortlist=a.shortlist),
               f"self-spec E={E} d<={2 * d} c={a.confidence:g} K={a.shortlist}":
                   SS(E, 2 * d, shortlist=a.shortlist, confidence=a.confidence),
               f"HF assistant_early_exit E={E} d={d}": DecodeConfig.hf_assistant(E, d),
               f"economize early_exit E={E} d={d}": DecodeConfig.economize(E, d),
               f"economize frspec K={a.shortlist} early_exit E={E} d={d}": DecodeConfig.economize(E, d, shortlist=a.shortlist)}
    if a.skip:   # the training-free drafter: the whole model minus a greedy choice of layers (chapter 7)
        path = probes.skip_search(lm, P["skip_blocks"], P["skip_block_tokens"], a.skip, seed=P["seed"])
        layers = tuple(int(x) for x in path.set_index("n_skip").loc[a.skip, "skip"].split())
        sd, K = a.skip_draft, a.shortlist
        methods[f"layer-skip draft ({a.skip} of {L} out) d={d}"] = SS(L, d, skip=layers)
        methods[f"layer-skip draft ({a.skip} of {L} out) d={sd} K={K}"] = SS(L, sd, skip=layers, shortlist=K)
        methods[f"economize layer_skip ({a.skip} of {L} out) d={d}"] = DecodeConfig.economize(L, d, skip=layers)
        methods[f"economize frspec K={K} layer_skip ({a.skip} of {L} out) d={sd}"] = \
            DecodeConfig.economize(L, sd, skip=layers, shortlist=K)
    full = DecodeConfig.full()
    for cfg in (full, *methods.values()):                      # warm-up (and the shortlist's token counts)
        decode(lm, [es.ids[0]], cfg, 4, stop_at_eos=False)
    _hf_generate_s(lm.model, es.ids[0], 4)
    print(f"model={lm.spec} (trained) L={L} threads={torch.get_num_threads()} prompts={len(es)} tokens={N} "
          f"reps={a.reps}")
    print(f"{'method':<48} {'tok/s':>7} {'full':>7} {'ratio':>6} {'accept':>7} {'lossless':>9}")
    speed, lossless = {}, {}
    # plain transformers generate (full depth), against our full depth
    t_h, t_f = [], []
    for r in range(a.reps):
        for ids in es.ids:
            t_h.append(_hf_generate_s(lm.model, ids, N))
            t_f.append(decode(lm, [ids], full, N, stop_at_eos=False).wall_s)
    th, tf = N / statistics.median(t_h), N / statistics.median(t_f)
    print(f"{'HF generate (full depth)':<48} {th:7.1f} {tf:7.1f} {th / tf:5.2f}x {'-':>7} {'-':>9}")
    for name, cfg in methods.items():
        t_m, t_f, acc, same = [], [], [], 0
        for r in range(a.reps):
            for ids in es.ids:
                runs = [("m", cfg), ("f", full)] if r % 2 == 0 else [("f", full), ("m", cfg)]
                got = {k: decode(lm, [ids], c, N, stop_at_eos=False) for k, c in runs}
                t_m.append(got["m"].wall_s)
                t_f.append(got["f"].wall_s)
                if r == 0:
                    same += got["m"].sequences()[0] == got["f"].sequences()[0]
                    acc.append(got["m"].acceptance)
        tm, tf = N / statistics.median(t_m), N / statistics.median(t_f)
        speed[name] = tm / tf
        lossless[name] = same == len(es)
        a_ = statistics.mean(acc) if all(x == x for x in acc) else float("nan")
        print(f"{name:<48} {tm:7.1f} {tf:7.1f} {tm / tf:5.2f}x {a_:7.0%} {same:>4}/{len(es):<4}")
    ours = {k: v for k, v in speed.items() if not k.startswith(("HF", "economize"))}
    eco = {k: v for k, v in speed.items() if k.startswith("economize") and lossless[k]}
    best = max(ours, key=ours.get)
    hf = speed[f"HF assistant_early_exit E={E} d={d}"]
    same = speed[f"self-spec E={E} d={d}"] / hf        # the same (E, d), ours against transformers'
    verdict = ("meets the 1.5x target" if ours[best] >= 1.5 else "at least full depth, short of 1.5x"
               if ours[best] >= 1.0 else f"misses 1.0x by {1 - ours[best]:.1%}")
    print(f"goal: best ours is {best} at {ours[best]:.2f}x full depth ({verdict}); at the same (E, d) = ({E}, {d}) "
          f"ours is {same:.2f}x the transformers peer (goal 1.3x: {'met' if same >= 1.3 else 'missed'}), and our best "
          f"{ours[best] / hf:.2f}x it")
    if eco:
        eb = max(eco, key=eco.get)
        print(f"economize's fastest lossless technique: {eb} at {eco[eb]:.2f}x full depth; ours is {ours[best] / eco[eb]:.2f}x it")
    else:
        print("economize: no lossless technique ran")


def _hf_generate_s(model, ids, n: int) -> float:
    """Seconds of plain greedy ``generate`` (full depth) for ``n`` new tokens of one prompt."""
    from earlyexit.clock import now

    x = torch.tensor([ids])
    t0 = now(x.device)
    with torch.inference_mode():
        model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       eos_token_id=None, pad_token_id=model.config.pad_token_id)
    return now(x.device) - t0


if __name__ == "__main__":
    main()

"""Engine full depth against HF ``generate`` and against the machine's memory bandwidth, side by side in one run.

Batch-1 greedy decoding reads every weight once per token, so its speed is bounded by memory bandwidth:
ceiling = bandwidth / bytes of the weights read per token (every decoder layer's matrices and the head once).
The benchmark measures the bandwidth (a streaming sum over a buffer larger than the caches), decodes the same
prompts with the engine (packed weights, the default on CPU, and the modules' own layout) and with HF
``generate`` (same model, dtype and thread count, interleaved, after a warm-up), and prints tokens/s of each,
the engine/HF ratio (goal: engine >= 1.0x), the ceiling and the engine's fraction of it (goal: >= 0.8 in fp32),
and the same matrices multiplied with nothing else, and the layers' math with nothing else (no rule, strategy,
provenance map or counters), so that the gap splits into the kernels', the math's small ops and the engine's
bookkeeping.
The bandwidth is the median of measurements taken before and between the repetitions.
Tokens/s include the prompt pass; the fraction of the ceiling is taken on the decoding steps alone (a run of
``--tokens`` minus a run of 1 token), since only they read every weight once per token.

Every weight path in one run, beside llama.cpp. The engine's paths: float32 (packed for oneDNN, and the modules'
own layout), bfloat16 (a bf16 model), and the weight-only ``int8`` and ``int4`` paths of
:mod:`earlyexit.engine.lowbit` (int4 holds the GGUF's own Q4_1 blocks); HF ``generate`` in float32; and, when
``llama-cpp-python`` is installed (``make llama-cpp``, an optional extra), llama.cpp on the embedded Q4_1 GGUF and on
copies converted with the ``gguf`` package to Q8_0, BF16 and F32 (kept under ``data/models/``). All of them
alternate prompt by prompt, over ``--reps`` rounds, the order reversed every other round. Printed per path:
tokens/s (prompt pass included), the bytes of weights a token reads, the share of the bandwidth ceiling for those
bytes (decoding steps alone), the paired speed ratio to llama.cpp at the same weight precision (float32 and F32,
bfloat16 and BF16, int8 and Q8_0, int4 and Q4_1) with its 95% interval over prompts, greedy agreement with the
engine's float32 tokens, and the largest logit difference against float32 along float32's own output.

``--kernels`` times the products alone instead, for every matrix of a layer and the head, at 1 to 16 rows: torch's
``linear`` over the module's weight (MKL) against oneDNN over the weight reordered once (what the engine uses),
side by side, with the bytes streamed per second and each row count's cost relative to one row. Each matrix is
taken from every layer in turn, so that the products read from memory, not from the caches.

    python benchmarks/bench_engine.py [--model smollm2-135m] [--prompts 6] [--tokens 64] [--reps 3] [--threads 1]
    python benchmarks/bench_engine.py --paths fp32,int4,llama-Q4_1 --threads 2
    python benchmarks/bench_engine.py --kernels
"""
from __future__ import annotations

import argparse
import statistics
import time

import pandas as pd
import torch

from earlyexit.corpus import encode, load_prompts
from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine import llamacpp
from earlyexit.engine.adapter import Adapter, blocked_linear
from earlyexit.engine.lowbit import LowBitAdapter
from earlyexit.engine.models import GGUF_NAME, embedded_dir, load_model
from earlyexit.experiments.speeds import paired_ratio


def bandwidth(mb: int = 512, reps: int = 7) -> float:
    """Sustained read bandwidth (bytes/s): the median of ``reps`` sums over an ``mb`` MB float32 buffer."""
    x = torch.ones(mb * 2**20 // 4, dtype=torch.float32)
    x.sum()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        x.sum()
        ts.append(time.perf_counter() - t)
    return x.numel() * 4 / statistics.median(ts)


def weight_products(A: Adapter, reps: int = 20) -> float:
    """Seconds a token of the weight products alone takes: the same oneDNN calls the engine makes at batch 1
    (packed W_Q|W_K|W_V, W_O with the residual, W_gate with SiLU, W_up times it, W_down with the residual in
    every layer, then the head), chained on one row with nothing else (no norm, attention, RoPE, cache or
    bookkeeping); the median of ``reps``. What the engine spends above it is its own work."""
    P = A.packed
    D = A.config.hidden_size
    x = torch.zeros(1, 1, D, dtype=A.dtype, device=A.device)

    def token():
        y = x
        for l, layer in enumerate(A.layers):
            q = P.qkv_proj(l, y)
            y = P.o_residual(l, q[..., :P.nq], y)
            y = P.mlp_residual(l, y, y, layer.mlp)
        return P.head(y)

    with torch.inference_mode():
        token(), token()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            token()
            ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def layer_math(A: Adapter, ctx: int = 96, tokens: int = 32) -> float:
    """Seconds a decoding step takes with the layers' math and nothing else: per layer the adapter's
    :meth:`~earlyexit.engine.adapter.Adapter.qkv` (input norm, packed W_Q|W_K|W_V, RoPE), the K/V write into a
    preallocated cache, SDPA over ``ctx`` + t keys and :meth:`~earlyexit.engine.adapter.Adapter.finish_layer`
    (W_O, the residual, the second norm, the packed MLP); then the final norm and the head; the median over
    ``tokens`` steps. No exit rule, fill strategy, provenance map, mask or counter: what the engine spends above
    it is its bookkeeping."""
    K = torch.zeros(A.L, 1, A.Hkv, ctx + tokens, A.d, dtype=A.dtype)
    V = torch.zeros_like(K)
    h0 = torch.zeros(1, 1, A.config.hidden_size, dtype=A.dtype)
    ts = []
    with torch.inference_mode():
        for t in range(tokens):
            t0 = time.perf_counter()
            h = h0
            cos, sin = A.rope(h, torch.tensor([[ctx + t]]))
            end = ctx + t + 1
            for l in range(A.L):
                q, k, v = A.qkv(l, h, cos, sin)
                K[l, :, :, ctx + t] = k[:, :, 0]
                V[l, :, :, ctx + t] = v[:, :, 0]
                o = torch.nn.functional.scaled_dot_product_attention(q, K[l, :, :, :end], V[l, :, :, :end],
                                                                     scale=A.attn_scale(l), enable_gqa=A.H != A.Hkv)
                h = A.finish_layer(l, h, o)
            A.logits(h).argmax(-1)
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def kernels(A: Adapter, rows=(1, 2, 3, 4, 8, 16), reps: int = 5) -> None:
    """Prints, per matrix and row count, the module layout's and oneDNN's microseconds a product, GB/s, and the
    cost relative to one row (see the module docstring)."""
    mats = {"W_Q|W_K|W_V": [torch.cat([ly.self_attn.q_proj.weight, ly.self_attn.k_proj.weight,
                                       ly.self_attn.v_proj.weight]) for ly in A.layers],
            "W_O": [ly.self_attn.o_proj.weight for ly in A.layers],
            "W_gate": [ly.mlp.gate_proj.weight for ly in A.layers],
            "W_down": [ly.mlp.down_proj.weight for ly in A.layers],
            "LM head": [A.head.weight]}
    print(f"{'matrix':<12} {'rows':>4} {'torch linear us':>16} {'GB/s':>6} {'x 1 row':>8} {'oneDNN us':>10} {'GB/s':>6} "
          f"{'x 1 row':>8} {'speed-up':>9}")
    with torch.inference_mode():
        for name, Ws in mats.items():
            fast = [blocked_linear(W) for W in Ws]
            nbytes = Ws[0].numel() * Ws[0].element_size()
            one = {}
            for r in rows:
                x = torch.randn(r, Ws[0].shape[1], dtype=A.dtype)
                res = {}
                for kind, fs in (("torch", [lambda W=W: torch.nn.functional.linear(x, W) for W in Ws]),
                                 ("onednn", [lambda f=f: f(x) for f in fast])):
                    for f in fs:
                        f()
                    ts = []
                    for _ in range(reps):
                        t = time.perf_counter()
                        for f in fs:
                            f()
                        ts.append((time.perf_counter() - t) / len(fs))
                    res[kind] = min(ts)
                    one.setdefault(kind, res[kind])
                print(f"{name:<12} {r:>4} {res['torch'] * 1e6:>16.1f} {nbytes / res['torch'] / 1e9:>6.1f} "
                      f"{res['torch'] / one['torch']:>7.2f}x {res['onednn'] * 1e6:>10.1f} "
                      f"{nbytes / res['onednn'] / 1e9:>6.1f} {res['onednn'] / one['onednn']:>7.2f}x "
                      f"{res['torch'] / res['onednn']:>8.2f}x")


def bytes_per_token(model) -> int:
    """Bytes of weights a batch-1 decoding step reads: every parameter once (a tied head counted once; the
    embedding table is the head's matrix), the embedding row itself being negligible."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


# path -> (weight precision it is paired on, what it is)
PATHS = {"fp32": ("fp32", "engine, float32, packed for oneDNN"),
         "fp32-modules": ("fp32", "engine, float32, the modules' own layout"),
         "bf16": ("bf16", "engine, bfloat16 model"),
         "int8": ("int8", "engine, int8 weights (rows scaled), bf16 products"),
         "int4": ("int4", "engine, int4 weights (the GGUF's Q4_1 blocks), bf16 products"),
         "hf": ("fp32", "HF generate, float32"),
         "llama-F32": ("fp32", "llama.cpp, F32 (dequantized Q4_1)"),
         "llama-BF16": ("bf16", "llama.cpp, BF16"),
         "llama-Q8_0": ("int8", "llama.cpp, Q8_0"),
         "llama-Q4_1": ("int4", "llama.cpp, Q4_1 (the embedded file)")}
# weight precision -> the llama.cpp path a path of that precision is paired with
PEER = {prec: name for name, (prec, _) in PATHS.items() if name.startswith("llama-")}


def contenders(a, names):
    """``name -> run(ids, n) -> (tokens, seconds)`` for every path in ``names``, with the bytes of weights each
    reads a token (skipping llama.cpp, with a line that says so, where it is not installed), and the engine's
    low-precision adapters (for their logits against float32)."""
    lm = load_model(a.model, dtype="float32")
    runs, nbytes, low = {}, {}, {}
    full = DecodeConfig.full()

    def engine(A):
        def run(ids, n):
            r = decode(A, [ids], full, n, stop_at_eos=False)
            return r.tokens[0].tolist(), r.wall_s
        return run

    for name in names:
        if name == "fp32":
            A = Adapter(lm).for_inference()
            runs[name], nbytes[name] = engine(A), bytes_per_token(lm.model)
        elif name == "fp32-modules":
            runs[name], nbytes[name] = engine(Adapter(lm, pack=False)), bytes_per_token(lm.model)
        elif name == "bf16":
            lm16 = load_model(a.model, dtype="bfloat16")
            low[name] = Adapter(lm16).for_inference()
            runs[name], nbytes[name] = engine(low[name]), bytes_per_token(lm16.model)
        elif name in ("int8", "int4"):
            low[name] = LowBitAdapter(lm, name).for_inference()
            small = sum(p.numel() * p.element_size() for p in lm.model.parameters() if p.ndim == 1)
            runs[name], nbytes[name] = engine(low[name]), low[name].packed.weight_bytes() + small
        elif name == "hf":
            def hf(ids, n):
                x = torch.tensor([ids])
                t = time.perf_counter()
                with torch.inference_mode():
                    out = lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                                            do_sample=False, pad_token_id=lm.tokenizer.pad_token_id or 0)
                return out[0, len(ids):].tolist(), time.perf_counter() - t
            runs[name], nbytes[name] = hf, bytes_per_token(lm.model)
        elif name.startswith("llama-"):
            if a.model != "smollm2-135m":
                print(f"{name}: skipped (llama.cpp runs on the embedded GGUF only)")
                continue
            if not llamacpp.available():
                print(f"{name}: skipped (llama-cpp-python is not installed: make llama-cpp)")
                continue
            prec = name.split("-", 1)[1]
            src = embedded_dir() / GGUF_NAME
            path = src if prec == "Q4_1" else llamacpp.convert_gguf(
                src, embedded_dir() / f"converted-gguf/{src.stem.rsplit('.', 1)[0]}.{prec}.gguf", prec)
            peer = llamacpp.LlamaCpp(path, threads=a.threads)
            runs[name], nbytes[name] = peer.greedy, llamacpp.gguf_bytes(path)
        else:
            raise ValueError(f"unknown path {name!r}: choose from {', '.join(PATHS)}")
    return lm, runs, nbytes, low


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--paths", default=",".join(PATHS),
                    help=f"comma-separated, from: {', '.join(PATHS)}")
    ap.add_argument("--kernels", action="store_true", help="time the weight products alone, by rows (see above)")
    a = ap.parse_args()
    names = [n.strip() for n in a.paths.split(",") if n.strip()]
    bad = [n for n in names if n not in PATHS]
    if bad or a.tokens < 2:
        ap.error(f"unknown path(s) {bad}: choose from {', '.join(PATHS)}" if bad else "--tokens must be >= 2")
    torch.set_num_threads(a.threads)
    if a.kernels:
        lm = load_model(a.model, dtype="float32")
        print(f"model={a.model} threads={torch.get_num_threads()}; memory bandwidth {bandwidth() / 1e9:.1f} GB/s")
        kernels(Adapter(lm))
        return
    if "fp32" not in names:                            # the reference of agreement and of the breakdown
        names = ["fp32"] + names
    lm, runs, nbytes, low = contenders(a, names)
    ps = encode(load_prompts("mix", a.prompts, seed=0, tokenizer=lm.tokenizer, max_prompt_tokens=96),
                lm.tokenizer, 96)
    n = a.tokens
    for run in runs.values():                          # warm-up
        run(ps[0], 4)
    t = {k: {} for k in runs}                          # name -> (prompt, round) -> seconds
    t1 = {k: [] for k in runs}                         # prompt pass alone (1 token)
    toks = {}
    bws = [bandwidth()]                                # measured between the rounds too: the bandwidth drifts
    order = list(runs)
    for r in range(a.reps):
        for p, ids in enumerate(ps):
            for k in (order if (r + p) % 2 == 0 else order[::-1]):
                out, s = runs[k](ids, n)
                t[k][p, r] = s
                toks.setdefault(k, {})[p] = out
                t1[k].append(runs[k](ids, 1)[1])
        bws.append(bandwidth())
    bw = statistics.median(bws)
    print(f"model={a.model} threads={torch.get_num_threads()} prompts={len(ps)} tokens={n} reps={a.reps}; "
          f"memory bandwidth {bw / 1e9:.1f} GB/s (median of {len(bws)})")
    ref_tokens = toks["fp32"]
    med = {k: statistics.median(v.values()) for k, v in t.items()}
    step = {k: (med[k] - statistics.median(t1[k])) / (n - 1) for k in runs}    # a decoding step, prompt pass out

    def paired(ref, k):
        """``ref``'s time over ``k``'s, prompt by prompt and round by round: "ratio [lo, hi]"."""
        pr = paired_ratio(pd.DataFrame([{"group": p, "round": r, "ratio": t[ref][p, r] / t[k][p, r]}
                                        for (p, r) in t[k]]))
        return f"{pr['ratio']:.2f}x [{pr['lo']:.2f}, {pr['hi']:.2f}]"

    print(f"{'path':<13} {'tok/s':>6} {'MB/token':>8} {'ceiling':>8} {'share':>6} {'vs llama.cpp (95% CI)':>24} "
          f"{'= fp32':>7}  what")
    for k in runs:
        ceiling = bw / nbytes[k]
        peer = PEER[PATHS[k][0]]
        vs = paired(peer, k) if peer in runs and peer != k else ""
        same = sum(toks[k][p] == ref_tokens[p] for p in ref_tokens)
        print(f"{k:<13} {n / med[k]:>6.1f} {nbytes[k] / 1e6:>8.0f} {ceiling:>8.1f} {1 / step[k] / ceiling:>6.2f} "
              f"{vs:>24} {same:>3}/{len(ps):<3}  {PATHS[k][1]}")
    if "hf" in runs:
        print(f"engine float32 / HF generate: {paired('hf', 'fp32')} (paired, 95% CI)")
    print("tok/s: the median run, prompt pass included; ceiling: bandwidth / bytes a token reads (tok/s); share: "
          "the decoding steps' rate over that ceiling; vs llama.cpp: the paired ratio at the same weight precision; "
          "= fp32: prompts whose greedy tokens equal the engine's float32 tokens")
    A = Adapter(lm).for_inference()                   # fp32 always runs: where its time goes
    if A.packed is not None:                          # packed weights: a CPU with oneDNN
        prod_s = statistics.median(weight_products(A) for _ in range(3))
        math_s = statistics.median(layer_math(A) for _ in range(3))
        s32 = step["fp32"]
        print(f"fp32, where a token's {s32 * 1e3:.1f} ms go: the weight products alone {prod_s * 1e3:.1f} ms "
              f"({1 / prod_s / (bw / nbytes['fp32']):.2f} of the ceiling), the layers' small ops (norms, RoPE, "
              f"attention, cache writes) {(math_s - prod_s) * 1e3:.1f} ms, the engine's bookkeeping "
              f"{(s32 - math_s) * 1e3:.1f} ms")
    if low:
        ids = ps[0]
        r32 = decode(lm, [ids], DecodeConfig.full(), 16, stop_at_eos=False, return_logits=True)
        for k, other in low.items():
            rk = decode(other, [ids], DecodeConfig.full(), 16, stop_at_eos=False, return_logits=True,
                        force=r32.tokens)
            diff = (rk.logits.float() - r32.logits).abs()
            top = (rk.logits.argmax(-1) == r32.logits.argmax(-1)).float().mean()
            print(f"{k} logits against float32 along float32's output (one prompt, 16 tokens): largest difference "
                  f"{diff.max():.3g} (logit scale {r32.logits.abs().max():.3g}); same top-1 at {top:.0%} of steps")


if __name__ == "__main__":
    main()

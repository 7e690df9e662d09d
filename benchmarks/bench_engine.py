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
``--dtype bfloat16`` halves the bytes (and reports the logit error against fp32).

``--kernels`` times the products alone instead, for every matrix of a layer and the head, at 1 to 16 rows: torch's
``linear`` over the module's weight (MKL) against oneDNN over the weight reordered once (what the engine uses),
side by side, with the bytes streamed per second and each row count's cost relative to one row. Each matrix is
taken from every layer in turn, so that the products read from memory, not from the caches.

    python benchmarks/bench_engine.py [--model smollm2-135m] [--prompts 6] [--tokens 64] [--reps 3] [--dtype float32]
    python benchmarks/bench_engine.py --kernels
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from earlyexit.corpus import encode, load_prompts
from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.adapter import Adapter, blocked_linear
from earlyexit.engine.models import load_model


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kernels", action="store_true", help="time the weight products alone, by rows (see above)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lm = load_model(a.model, device=a.device, dtype=a.dtype)
    if a.kernels:
        print(f"model={a.model} dtype={a.dtype} threads={torch.get_num_threads()}; memory bandwidth "
              f"{bandwidth() / 1e9:.1f} GB/s")
        kernels(Adapter(lm))
        return
    ps = encode(load_prompts("mix", a.prompts, seed=0, tokenizer=lm.tokenizer, max_prompt_tokens=96),
                lm.tokenizer, 96)
    dev = lm.device
    full = DecodeConfig.full()

    plain_layout = Adapter(lm, pack=False)

    def ours(ids, n=a.tokens):
        return decode(lm, [ids], full, n, stop_at_eos=False).wall_s

    def modules(ids):
        return decode(plain_layout, [ids], full, a.tokens, stop_at_eos=False).wall_s

    def hf(ids):
        x = torch.tensor([ids], device=dev)
        t = time.perf_counter()
        with torch.inference_mode():
            lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=a.tokens,
                              min_new_tokens=a.tokens, do_sample=False, pad_token_id=2)
        return time.perf_counter() - t

    def prompt_pass(ids):
        return ours(ids, 1)

    ours(ps[0]), modules(ps[0]), hf(ps[0])  # warm-up
    t = {f.__name__: [] for f in (ours, modules, hf, prompt_pass)}
    bws, products, maths = [bandwidth()], [], []     # measured between the runs too: the machine's bandwidth drifts
    A = Adapter(lm).for_inference()
    for r in range(a.reps):
        for ids in ps:  # interleaved, alternating the order
            fs = [ours, modules, hf, prompt_pass]
            for f in (fs if r % 2 == 0 else fs[::-1]):
                t[f.__name__].append(f(ids))
        bws.append(bandwidth())
        if A.packed is not None:          # packed weights: a CPU with oneDNN
            products.append(weight_products(A))
            maths.append(layer_math(A))
    n = a.tokens
    tps = {k: n / statistics.median(v) for k, v in t.items() if k != "prompt_pass"}
    steps = [(o - p) / (n - 1) for o, p in zip(t["ours"], t["prompt_pass"])]
    step_tps = 1 / statistics.median(steps)
    bw = statistics.median(bws)
    per_token = bytes_per_token(lm.model)
    ceiling = bw / per_token
    prod_s = statistics.median(products) if products else None
    print(f"model={a.model} device={dev} dtype={a.dtype} threads={torch.get_num_threads()} prompts={len(ps)} "
          f"tokens={n} reps={a.reps}")
    print(f"engine full depth: {tps['ours']:.1f} tok/s   engine, module layout: {tps['modules']:.1f} tok/s   "
          f"HF generate: {tps['hf']:.1f} tok/s (median over {len(t['ours'])} runs each, prompt pass included)")
    print(f"ratio engine/HF = {tps['ours'] / tps['hf']:.2f}x   packed/module layout = "
          f"{tps['ours'] / tps['modules']:.2f}x")
    print(f"memory bandwidth {bw / 1e9:.1f} GB/s, weights read per token {per_token / 1e6:.0f} MB: ceiling "
          f"{ceiling:.1f} tok/s; engine decoding steps {step_tps:.1f} tok/s = {step_tps / ceiling:.2f} of the "
          f"ceiling")
    if prod_s is not None:
        print(f"the weight products alone: {1 / prod_s:.1f} tok/s = {1 / prod_s / ceiling:.2f} of the ceiling; the "
              f"engine's other work (norms, RoPE, attention, the cache, Python) costs "
              f"{(1 / step_tps - prod_s) * 1e3:.1f} ms of its {1e3 / step_tps:.1f} ms a token")
        math_s = statistics.median(maths)
        print(f"the layers' math alone (no rule, strategy, provenance map, mask or counters): {1 / math_s:.1f} tok/s "
              f"= {1 / math_s / ceiling:.2f} of the ceiling; of the other work, the math's small ops (norms, RoPE, "
              f"attention, cache writes) cost {(math_s - prod_s) * 1e3:.1f} ms a token and the engine's bookkeeping "
              f"{(1 / step_tps - math_s) * 1e3:.1f} ms")
    if a.dtype != "float32":
        ref = load_model(a.model, device=a.device, dtype="float32")
        ids = ps[0]
        r32 = decode(ref, [ids], full, 16, stop_at_eos=False, return_logits=True)
        r16 = decode(lm, [ids], full, 16, stop_at_eos=False, return_logits=True, force=r32.tokens)  # same path
        diff = (r16.logits - r32.logits).abs()
        same = (r16.logits.argmax(-1) == r32.logits.argmax(-1)).float().mean()
        print(f"{a.dtype} logits against float32 along the float32 output (one prompt, 16 tokens): max abs diff "
              f"{diff.max():.3g}, mean {diff.mean():.3g}; same top-1 token at {same:.0%} of the steps")


if __name__ == "__main__":
    main()

"""Wall-clock speed, measured side by side and kept in the result cache.

Every timing entry's key holds the torch thread count it was measured with. Decoding speed is reported
as decoding steps per second: the prompt pass is timed separately (a one-token run) and taken out.
Each measurement is the best of ``repeats`` runs (:func:`best_of`), the usual guard against a busy machine.
"""
from __future__ import annotations

import math

import pandas as pd
import torch

from ..engine import DecodeConfig, decode
from .. import store
from ..engine.result import calls_json
from .points import point_params, split_ints
from .evalset import EvalSet

FULL = DecodeConfig.full()


def best_of(repeats: int, runs: dict) -> dict:
    """Call each function of ``runs`` (name -> fn returning a Result) in turn, ``repeats`` times, back to
    back; return name -> (fastest wall time, that name's last Result)."""
    best = {k: math.inf for k in runs}
    last = {}
    for _ in range(repeats):
        for k, fn in runs.items():
            r = fn()
            best[k] = min(best[k], r.wall_s)
            last[k] = r
    return {k: (best[k], last[k]) for k in runs}


def _decode_rate(lm, ids, n_new: int, cfg: DecodeConfig, repeats: int) -> dict:
    """Best-of timing of ``cfg`` on the prompts ``ids`` (one batch), the prompt pass taken out."""
    got = best_of(repeats, {"pre": lambda: decode(lm, ids, FULL, 1, stop_at_eos=False),
                            "run": lambda: decode(lm, ids, cfg, n_new, stop_at_eos=False)})
    (best_pre, _), (best, tr) = got["pre"], got["run"]
    s = tr.steps()
    steps = len(ids) * (n_new - 1)
    return {"batch": len(ids), "wall_s": best, "prefill_s": best_pre, "tok_s": steps / max(best - best_pre, 1e-9),
            "layers": float((tr.counts["layers_run"] + tr.counts["recompute_layers"])[s].mean()),
            "head_checks": float(tr.counts["head_checks"][s].mean()),
            "calls": calls_json(tr.meta["calls"]["decode"])}


def time_point(lm, es: EvalSet, n_new: int, cfg: DecodeConfig, batch: int = 1, repeats: int = 2) -> pd.DataFrame:
    """Wall-clock decoding speed (cached): the first ``batch`` prompts decoded together, ``n_new`` tokens
    each without stopping at EOS, best of ``repeats``. At batch 1 each of the set's prompts is timed on its
    own (one row each); ``tok_s`` is decoding steps per second, all rows counted."""
    def compute():
        if batch == 1:
            return [{"prompt": b, **_decode_rate(lm, [es.ids[b]], n_new, cfg, repeats)} for b in range(len(es))]
        return [{"prompt": -1, **_decode_rate(lm, es.ids[:batch], n_new, cfg, repeats)}]

    params = point_params(es, n_new, cfg, batch=batch, repeats=repeats, threads=torch.get_num_threads())
    df = store.cached("timing", params, compute, model=lm)
    cols = cfg.columns()
    df.insert(0, "label", cfg.label)
    df.insert(1, "rule", cols["rule"])
    df.insert(2, "strategy", cols["strategy"])
    return df


def time_replay(lm, es: EvalSet, n_new: int, df: pd.DataFrame, strategy: str, repeats: int = 2) -> pd.DataFrame:
    """Batch-1 decoding speed (cached) of each prompt of ``es`` replaying the exit layers a point
    table ``df`` recorded for it (rule "scripted"), with ``strategy``: the same exits, no exit test.
    Separates what a fill strategy costs in wall time from what the exit rule's checks cost."""
    L = lm.config.num_hidden_layers
    scripts = {int(r["prompt"]): [L] + split_ints(r["exits"])[1:] for _, r in df.iterrows()}

    def compute():
        rows = []
        for b in range(len(es)):
            cfg = DecodeConfig.early_exit("scripted", strategy, exits=tuple(scripts[b][:n_new]))
            r = _decode_rate(lm, [es.ids[b]], n_new, cfg, repeats)
            rows.append({"prompt": b, "batch": 1, "wall_s": r["wall_s"], "prefill_s": r["prefill_s"],
                         "tok_s": r["tok_s"], "layers": r["layers"], "calls": r["calls"]})
        return rows

    params = {"prompts": es.spec, "n_new": n_new, "strategy": strategy, "repeats": repeats,
              "scripts": {str(b): scripts[b][:n_new] for b in range(len(es))}, "threads": torch.get_num_threads()}
    out = store.cached("timing_replay", params, compute, model=lm)
    out.insert(0, "strategy", strategy)
    return out


def spec_params(es: EvalSet, n_new: int, exit_layer: int, draft_len: int, repeats: int, peer: bool,
                draft: dict | None = None) -> dict:
    """The result-cache parameters of :func:`spec_point` (also used to ask whether an entry exists)."""
    p = {"prompts": es.spec, "n_new": n_new, "E": int(exit_layer), "d": int(draft_len), "repeats": repeats,
         "peer": peer, "threads": torch.get_num_threads()}
    if draft:  # drafting options (shortlist, confidence); absent for plain drafts, whose keys stay as they were
        p["draft"] = dict(sorted(draft.items()))
    return p


def spec_point(lm, es: EvalSet, n_new: int, exit_layer: int, draft_len: int, repeats: int = 1,
               peer: bool = True, **draft) -> pd.DataFrame:
    """LayerSkip self-speculative decoding at (E, d) on every prompt of ``es`` (cached), timed side by side
    with full-depth decoding (this engine) and, if ``peer``, with transformers'
    ``generate(assistant_early_exit=E)`` at the same draft length: for each prompt and repeat the three run
    back to back, ``n_new`` tokens each without stopping at EOS, and the fastest repeat counts.

    One row per prompt: ``full_s``, ``spec_s``, ``hf_s`` (wall seconds, prompt pass included, the same for
    all three), ``speedup`` (full_s / spec_s), ``vs_hf`` (hf_s / spec_s), ``lossless`` (our tokens equal
    full depth's), ``hf_lossless``, ``acceptance`` (accepted / drafted), ``rounds``, ``tokens_per_round``,
    ``layers`` (decoder-layer evaluations per decoding step, draft + verify, prompt pass excluded as for
    every other method), ``heads`` (head evaluations per decoding step), ``spec_prefill_s`` (the prompt pass of
    our decoder's last timed run, measured inside it: decoding alone takes about ``spec_s − spec_prefill_s``). ``draft``: drafting options of
    :meth:`DecodeConfig.self_speculation` (``shortlist=K``, ``confidence=c``) for our decoder; the peer keeps
    its plain drafts."""
    draft = {k: v for k, v in draft.items() if v}
    spec = DecodeConfig.self_speculation(exit_layer, draft_len, **draft)
    hf = DecodeConfig.hf_assistant(exit_layer, draft_len)

    def compute():
        rows = []
        for b, ids in enumerate(es.ids):
            runs = {"full": lambda: decode(lm, [ids], FULL, n_new, stop_at_eos=False),
                    "spec": lambda: decode(lm, [ids], spec, n_new, stop_at_eos=False)}
            if peer:
                runs["hf"] = lambda: decode(lm, [ids], hf, n_new, stop_at_eos=False)
            got = best_of(repeats, runs)
            ref = got["full"][1].sequences()[0]
            sp = got["spec"][1]
            n = int(sp.n_new[0])
            rows.append({"prompt": b, "E": exit_layer, "d": draft_len, "K": int(draft.get("shortlist", 0)),
                         "confidence": float(draft.get("confidence", 0.0)), "n_new": n,
                         "full_s": got["full"][0], "spec_s": got["spec"][0],
                         # the prompt pass of the fastest repeat's kept run, measured inside it
                         "spec_prefill_s": float(sp.meta.get("prefill_s", float("nan"))),
                         "hf_s": got["hf"][0] if peer else float("nan"),
                         "lossless": bool(sp.sequences()[0] == ref),
                         "hf_lossless": bool(got["hf"][1].sequences()[0] == ref) if peer else float("nan"),
                         "acceptance": sp.acceptance, "rounds": int(sp.rounds[0]),
                         "tokens_per_round": (n - 1) / max(int(sp.rounds[0]), 1),
                         # per decoding step, like every other method: the prompt pass (which also
                         # predicts token 0) is left out
                         "layers": float(sp.per_step("layers_run")[0]), "heads": float(sp.per_step("head_checks")[0]),
                         "full_calls": calls_json(got["full"][1].meta["calls"]),
                         "spec_calls": calls_json(sp.meta["calls"])})
        return rows

    df = store.cached("spec_point", spec_params(es, n_new, exit_layer, draft_len, repeats, peer, draft), compute,
                      model=lm)
    if "K" not in df.columns:  # entries made before the drafting options
        df.insert(3, "K", 0)
        df.insert(4, "confidence", 0.0)
    df["speedup"] = df["full_s"] / df["spec_s"]
    df["vs_hf"] = df["hf_s"] / df["spec_s"]
    df["full_tok_s"] = df["n_new"] / df["full_s"]
    df["spec_tok_s"] = df["n_new"] / df["spec_s"]
    df["hf_tok_s"] = df["n_new"] / df["hf_s"]
    return df


def has_spec_point(lm, es: EvalSet, n_new: int, exit_layer: int, draft_len: int, repeats: int) -> bool:
    """Whether :func:`spec_point` with the transformers peer is in the result cache, or being computed by another
    process (chapter 7 beside chapter 8): then reading it waits for it rather than timing the point again."""
    return store.has("spec_point", spec_params(es, n_new, exit_layer, draft_len, repeats, True), model=lm,
                     or_claimed=True)


def side_by_side(lm, es: EvalSet, n_new: int, configs: dict, repeats: int = 1) -> pd.DataFrame:
    """Each configuration of ``configs`` ({name: DecodeConfig}) timed against full depth on every prompt of
    ``es`` at batch 1 (cached): per prompt and repeat, full depth and every configuration run back to back,
    ``n_new`` tokens without stopping at EOS; the fastest repeat counts. One row per (prompt, method):
    ``seconds`` (prompt pass included), ``full_s``, ``speedup`` (full_s / seconds), ``lossless`` (tokens equal
    full depth's), ``acceptance`` (accepted / drafted, NaN for methods that do not draft)."""
    def compute():
        rows = []
        for b, ids in enumerate(es.ids):
            runs = {"\0full": lambda: decode(lm, [ids], FULL, n_new, stop_at_eos=False)}
            runs.update({name: (lambda c=c: decode(lm, [ids], c, n_new, stop_at_eos=False))
                         for name, c in configs.items()})
            got = best_of(repeats, runs)
            full_s, ref = got["\0full"][0], got["\0full"][1].sequences()[0]
            for name in configs:
                s, r = got[name]
                rows.append({"prompt": b, "method": name, "label": configs[name].label, "seconds": s,
                             "full_s": full_s, "lossless": bool(r.sequences()[0] == ref),
                             "acceptance": r.acceptance})
        return rows

    params = {"prompts": es.spec, "n_new": n_new, "repeats": repeats, "threads": torch.get_num_threads(),
              "configs": {name: c.key() for name, c in configs.items()}}
    df = store.cached("side_by_side", params, compute, model=lm)
    df["speedup"] = df["full_s"] / df["seconds"]
    return df


# ------------------------------------------------------------------------------ paired timings, fit to cite


def decode_seconds(r) -> float:
    """Wall seconds of a run's decoding steps alone: its time less its prompt pass, both measured in the same run
    (``meta["prefill_s"]``); a peer that cannot tell them apart gives its whole time."""
    pre = r.meta.get("prefill_s", float("nan"))
    return r.wall_s - pre if math.isfinite(pre) else r.wall_s


def paired_runs(lm, es: EvalSet, n_new: int, cfg: DecodeConfig, ref: DecodeConfig = FULL, rounds: int = 3,
                batch: int = 1) -> pd.DataFrame:
    """The method ``cfg`` and its reference ``ref`` timed in turn, group by group (``batch`` prompts decoded
    together; at batch 1 each prompt alone), ``n_new`` tokens without stopping at EOS, for ``rounds`` rounds,
    the order alternating (the reference first in even rounds), after one untimed warm-up of each: both see the
    same prompts in the same minutes, so whatever else the machine does slows both alike (cached).

    One row per (group, round): ``group``, ``round``, ``first`` (which ran first), ``method_s`` and ``ref_s``
    (seconds of the decoding steps, prompt pass taken out within each run), ``steps`` (decoding steps timed,
    all rows counted) and ``ratio`` = ref_s / method_s (the method's speed relative to the reference)."""
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    if not isinstance(batch, int) or not 1 <= batch <= len(es):
        raise ValueError(f"batch must be an int in [1, {len(es)}] (the prompts in the set), got {batch!r}")
    groups = [es.ids[i:i + batch] for i in range(0, len(es) - batch + 1, batch)]

    def run(c, ids):
        return decode(lm, ids, c, n_new, stop_at_eos=False)

    def compute():
        for ids in groups[:1]:                   # warm-up: first calls pay for allocations and packing
            run(ref, ids), run(cfg, ids)
        rows = []
        for k in range(rounds):
            for g, ids in enumerate(groups):
                order = (("ref", ref), ("method", cfg)) if k % 2 == 0 else (("method", cfg), ("ref", ref))
                got = {name: decode_seconds(run(c, ids)) for name, c in order}
                rows.append({"group": g, "round": k, "first": order[0][0], "method_s": got["method"],
                             "ref_s": got["ref"], "steps": len(ids) * (n_new - 1)})
        return rows

    params = {"prompts": es.spec, "n_new": n_new, "method": cfg.key(), "ref": ref.key(), "rounds": rounds,
              "batch": batch, "threads": torch.get_num_threads()}
    df = store.cached("paired_timing", params, compute, model=lm)
    df["ratio"] = df["ref_s"] / df["method_s"]
    return df


def paired_ratio(runs: pd.DataFrame, seed: int = 0, n_boot: int = 2000) -> dict:
    """The method's speed relative to its reference from :func:`paired_runs`: each group's median ratio over
    rounds, their geometric mean over groups (``ratio``), and its 95% interval (``lo``, ``hi``: a bootstrap over
    groups of the mean log ratio; with a single group, the spread of its rounds). ``verdict`` is "faster" or
    "slower" only when the interval excludes 1.0, else "no different"; ``digits`` is how many decimals the
    interval supports (its half-width to one significant figure)."""
    import numpy as np

    per = np.log(runs.groupby("group")["ratio"].median().to_numpy())
    if len(per) > 1:
        rng = np.random.default_rng(seed)
        boots = per[rng.integers(0, len(per), (n_boot, len(per)))].mean(1)
        lo, hi = np.quantile(boots, [0.025, 0.975])
    else:
        logs = np.log(runs["ratio"].to_numpy())
        lo, hi = (np.quantile(logs, [0.025, 0.975]) if len(logs) > 1 else (logs[0], logs[0]))
    m, lo, hi = float(np.exp(per.mean())), float(np.exp(lo)), float(np.exp(hi))
    verdict = "faster" if lo > 1.0 else "slower" if hi < 1.0 else "no different"
    half = max((hi - lo) / 2, 1e-12)
    digits = max(0, min(3, -int(math.floor(math.log10(half)))))
    return {"ratio": m, "lo": lo, "hi": hi, "verdict": verdict, "digits": digits, "groups": int(len(per)),
            "rounds": int(runs["round"].nunique())}

"""Wall-clock speed, measured side by side and kept in the result cache.

Every timing entry's key holds the torch thread count it was measured with. Decoding speed is reported
as decoding steps per second, the prompt pass (measured inside each run) taken out.

The protocol every speed ratio of the book follows (:func:`time_point`, :func:`paired_runs`): the method and
its reference (full depth, same model, prompts and threads) run in turn, prompt by prompt, for several rounds,
the order alternating by round, after one untimed warm-up of each. Whatever else the machine does in those
minutes slows both alike. The ratio is taken per prompt from each arm's :func:`step_floor` (the sum over
decoding steps of each step's fastest time over the rounds; the median of the rounds' ratios where a peer has
no per-step times) and summarized by :mod:`earlyexit.experiments.speeds` (kept apart, so that its statistics
can change without re-timing). Why the floor: on the 2-core reference machine one decoding step of full depth
takes 46 to 68-73 ms (1st to 99th percentile, median 50-52) with the machine otherwise idle, and a whole
32-token decode of one prompt 1.42 to 1.87 s, so that one round's A/A ratio (full depth against itself)
spreads 5-9% and the run-to-run spread of the book's ratios (0.012 in log) is what that noise leaves after
6-12 prompts x 3 rounds; each step's fastest time over the same 3 rounds spreads the A/A ratio 0.65-0.7 times as
much (``benchmarks/bench_timing.py``). A batch
above 1 is timed with no other notebook of the build running (:func:`earlyexit.quiet.quiet`): a batched decode
contends with the other core for memory bandwidth, which alternation does not cancel. A round that such a
block paused half-way (its timings would hold the pause) is taken again (:func:`unpaused`).
"""
from __future__ import annotations

import math
from contextlib import nullcontext

import pandas as pd
import torch

from ..engine import DecodeConfig, decode
from .. import store
from ..quiet import pauses, quiet
from ..engine.result import calls_json
from .points import point_params, split_ints
from .evalset import EvalSet

FULL = DecodeConfig.full()
# a batched timing is one group of prompts, so its interval comes from its rounds: at least this many
BATCH_ROUNDS = 4
# how often a timing paused by the runner (another notebook's quiet block) is taken again before it is kept
RETAKES = 5


def unpaused(fn):
    """``fn()``, taken again (up to :data:`RETAKES` times) while the book's runner paused or resumed this process
    during it: a notebook suspended beside another's quiet block would count the pause as its own time (a
    paired round read 0.01x or 15x). Outside the runner nothing pauses and ``fn`` runs once."""
    for _ in range(RETAKES):
        before = pauses()
        out = fn()
        if pauses() == before:
            return out
    return fn()


def best_of(repeats: int, runs: dict) -> dict:
    """Call each function of ``runs`` (name -> fn returning a Result) in turn, ``repeats`` times, back to
    back; return name -> (fastest wall time, that name's last Result)."""
    best = {k: math.inf for k in runs}
    last = {}
    for _ in range(repeats):
        for k, fn in runs.items():
            r = unpaused(fn)
            best[k] = min(best[k], r.wall_s)
            last[k] = r
    return {k: (best[k], last[k]) for k in runs}


def _alternate(lm, groups: list, n_new: int, cfg, ref: DecodeConfig, rounds: int) -> list[dict]:
    """The timing protocol (module docstring): ``cfg`` (one config, or a list of one per group) and ``ref`` in
    turn on each group of prompts (decoded together), ``rounds`` rounds, the reference first in even rounds,
    after one untimed warm-up of each. One
    row per (group, round): seconds of the decoding steps of each (prompt pass out), and what the method's run
    did (its wall and prompt-pass seconds, layers and head evaluations per step, calls)."""
    def run(c, ids):
        return decode(lm, ids, c, n_new, stop_at_eos=False)

    cfgs = list(cfg) if isinstance(cfg, (list, tuple)) else [cfg] * len(groups)
    for ids, c in zip(groups[:1], cfgs):     # warm-up: first calls pay for allocations and packing
        run(ref, ids), run(c, ids)
    rows, kept = [], {(g, arm): [] for g in range(len(groups)) for arm in ("method", "ref")}
    for k in range(rounds):
        for g, ids in enumerate(groups):
            c = cfgs[g]
            order = (("ref", ref), ("method", c)) if k % 2 == 0 else (("method", c), ("ref", ref))
            got = unpaused(lambda: {name: run(c, ids) for name, c in order})   # both, in one window
            kept[g, "method"].append(got["method"]), kept[g, "ref"].append(got["ref"])
            m, s = got["method"], got["method"].steps()
            rows.append({"group": g, "round": k, "first": order[0][0], "method_s": decode_seconds(m),
                         "ref_s": decode_seconds(got["ref"]), "steps": len(ids) * (n_new - 1),
                         "wall_s": m.wall_s, "prefill_s": float(m.meta.get("prefill_s", float("nan"))),
                         "layers": float((m.counts["layers_run"] + m.counts["recompute_layers"])[s].mean()),
                         "head_checks": float(m.counts["head_checks"][s].mean()),
                         "calls": calls_json(m.meta["calls"]["decode"])})
    for r in rows:
        r["method_floor_s"] = step_floor(kept[r["group"], "method"])
        r["ref_floor_s"] = step_floor(kept[r["group"], "ref"])
    return rows


def step_floor(results) -> float:
    """The decoding time of one configuration on one group of prompts, robust to the machine's bursts: the sum
    over decoding steps of each step's fastest time over the runs ``results`` (its rounds; Results whose
    ``meta["step_s"]`` holds each step's wall seconds). A step's work is the same in every round (greedy, the
    same prompts and exits), so what varies between rounds is what the machine did meanwhile. NaN when a run
    has no per-step times (a peer) or the runs took different numbers of steps."""
    steps = [r.meta.get("step_s") for r in results]
    if not steps or any(x is None for x in steps) or len({len(x) for x in steps}) != 1 or not steps[0]:
        return float("nan")
    return float(torch.tensor(steps, dtype=torch.float64).min(dim=0).values.sum())


def _per_group(raw: list[dict], sizes: list[int], one_by_one: bool) -> list[dict]:
    """:func:`_alternate`'s rows summarized per group (the columns of :func:`time_point`)."""
    rows = []
    for g, d in pd.DataFrame(raw).groupby("group", sort=True):
        best = d.loc[d["method_s"].idxmin()]
        ratios = d["ref_s"] / d["method_s"]
        floor = float(d["ref_floor_s"].iloc[0] / d["method_floor_s"].iloc[0])
        rows.append({"prompt": int(g) if one_by_one else -1, "batch": sizes[int(g)],
                     "wall_s": float(best["wall_s"]), "prefill_s": float(best["prefill_s"]),
                     "tok_s": float(best["steps"] / max(best["method_s"], 1e-9)),
                     "ref_tok_s": float(best["steps"] / max(d["ref_s"].min(), 1e-9)),
                     "ratio": floor if math.isfinite(floor) else float(ratios.median()),
                     "round_ratios": " ".join(f"{x:.6g}" for x in ratios),
                     "layers": float(best["layers"]), "head_checks": float(best["head_checks"]),
                     "calls": best["calls"]})
    return rows


def time_point(lm, es: EvalSet, n_new: int, cfg: DecodeConfig, batch: int = 1, repeats: int = 2) -> pd.DataFrame:
    """Wall-clock decoding speed of ``cfg`` paired with full depth (cached), by the protocol of the module
    docstring with ``repeats`` rounds: at batch 1 each prompt of the set on its own (one row each); at a larger
    ``batch`` the first ``batch`` prompts decoded together (one row, at least :data:`BATCH_ROUNDS` rounds, whose
    spread gives the interval), ``n_new`` tokens each without stopping at EOS. Columns: ``tok_s`` and ``ref_tok_s`` (decoding steps per second of the method and of full depth, their
    fastest round), ``ratio`` (the method's speed over full depth's, median over rounds of the per-round ratio),
    ``round_ratios`` (each round's, space-separated), ``wall_s`` and ``prefill_s`` (the method's fastest round),
    ``layers``, ``head_checks`` and ``calls`` of the method's run. :func:`earlyexit.experiments.speeds.speed`
    turns the rows into a ratio with its interval."""
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats (timing rounds) must be an int >= 1, got {repeats!r}")
    if not isinstance(batch, int) or not 1 <= batch <= len(es):
        raise ValueError(f"batch must be an int in [1, {len(es)}] (the prompts in the set), got {batch!r}")

    rounds = repeats if batch == 1 else max(repeats, BATCH_ROUNDS)

    def compute():
        groups = [[ids] for ids in es.ids] if batch == 1 else [es.ids[:batch]]
        with quiet(f"a batch-{batch} timing") if batch > 1 else nullcontext():
            runs = _alternate(lm, groups, n_new, cfg, FULL, rounds)
        return _per_group(runs, [len(g) for g in groups], batch == 1)

    params = point_params(es, n_new, cfg, batch=batch, repeats=rounds, threads=torch.get_num_threads())
    params["paired_with"] = FULL.key()
    df = store.cached("timing", params, compute, model=lm)
    cols = cfg.columns()
    df.insert(0, "label", cfg.label)
    df.insert(1, "rule", cols["rule"])
    df.insert(2, "strategy", cols["strategy"])
    return df


def time_replay(lm, es: EvalSet, n_new: int, df: pd.DataFrame, strategy: str, repeats: int = 2) -> pd.DataFrame:
    """Batch-1 decoding speed (cached) of each prompt of ``es`` replaying the exit layers a point
    table ``df`` recorded for it (rule "scripted"), with ``strategy``: the same exits, no exit test, paired
    with full depth by the protocol of :func:`time_point` (the same columns, one row per prompt).
    Separates what a fill strategy costs in wall time from what the exit rule's checks cost."""
    L = lm.config.num_hidden_layers
    scripts = {int(r["prompt"]): [L] + split_ints(r["exits"])[1:] for _, r in df.iterrows()}

    def compute():
        cfgs = [DecodeConfig.early_exit("scripted", strategy, exits=tuple(scripts[b][:n_new])) for b in range(len(es))]
        return _per_group(_alternate(lm, [[ids] for ids in es.ids], n_new, cfgs, FULL, repeats), [1] * len(es), True)

    params = {"prompts": es.spec, "n_new": n_new, "strategy": strategy, "repeats": repeats,
              "scripts": {str(b): scripts[b][:n_new] for b in range(len(es))}, "threads": torch.get_num_threads(),
              "paired_with": FULL.key()}
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

    def compute():
        return [{k: r[k] for k in ("group", "round", "first", "method_s", "ref_s", "steps", "method_floor_s",
                                   "ref_floor_s")}
                for r in _alternate(lm, groups, n_new, cfg, ref, rounds)]

    params = {"prompts": es.spec, "n_new": n_new, "method": cfg.key(), "ref": ref.key(), "rounds": rounds,
              "batch": batch, "threads": torch.get_num_threads()}
    df = store.cached("paired_timing", params, compute, model=lm)
    df["ratio"] = df["ref_s"] / df["method_s"]
    df["group_ratio"] = df["ref_floor_s"] / df["method_floor_s"]
    return df

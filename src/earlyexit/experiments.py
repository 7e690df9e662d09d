"""The experiments the chapters call: one decoding configuration measured on a prompt set.

A *point* is (prompt set, tokens to generate, exit rule with its arguments, fill strategy). Running a
point decodes every prompt of the set in one batch and returns a tidy table, one row per prompt:

    consistency with the full model   exact_match, ttd (tokens to first divergence), rouge_full
    quality against the reference     rouge_ref (token ids), ppl_ref (teacher-forced, optional)
    cost                              layers (decoder layers per decoding step, recompute included),
                                      own_layers, recompute_layers, copied_kv, head_checks,
                                      pending_layers (lazy recompute: skipped layers never run),
                                      flop_fraction and effective_layers (earlyexit.metrics.cost_summary)
    what happened                     exit_rate, hole_reads, the tokens and exit layers (space-separated)

Every point goes through the result cache (:mod:`earlyexit.store`): its key holds the point's
parameters, the prompt set's hash, the model's weights hash and the library's code version, so a
chapter that asks for a point another chapter has computed reads it from disk.

Conventions: per-token averages are over the decoding *steps* (generated tokens t >= 1); token 0 is
predicted by the prompt pass, which is the same full-depth pass for every method. Token-level
metrics compare token ids (not words).

    from earlyexit import experiments as ex
    es = ex.eval_set(lm, kind="mix", n=12, seed=0, max_prompt_tokens=96)
    df = ex.point(lm, es, 32, "softmax", "copy-forward", dict(threshold=0.9, min_layer=15))
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from . import metrics, store
from .cache import COMPUTED, COPIED, HOLE, PAD, RECOMPUTED, STATE_NAMES
from .data import encode, load_prompts
from .decode import generate

IGNORE = -100


# ----------------------------------------------------------------------------------- set-up


def set_threads(n: int) -> int:
    """Use ``n`` CPU threads for torch (0: leave torch's default). Returns the number in use.

    Measured on a shared 2-core machine: with other processes running, one thread decodes up to
    six times faster than two (the second thread spins waiting for a core it does not get).
    """
    if n and n > 0:
        torch.set_num_threads(n)
    return torch.get_num_threads()


@dataclass
class EvalSet:
    """Prompts, their token ids and their references (token ids, None where there is none)."""

    prompts: list
    ids: list[list[int]]
    refs: list[list[int] | None]
    spec: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, n: int) -> "EvalSet":
        """The first ``n`` prompts (its spec says so, so cached results keep apart)."""
        spec = {**self.spec, "take": n}
        return EvalSet(self.prompts[:n], self.ids[:n], self.refs[:n], spec)

    def part(self, start: int, stop: int) -> "EvalSet":
        """Prompts ``start..stop-1`` (e.g. a calibration half and a test half)."""
        if not 0 <= start < stop <= len(self):
            raise ValueError(f"part({start}, {stop}) is outside the {len(self)} prompts of this set")
        spec = {**self.spec, "part": [start, stop]}
        return EvalSet(self.prompts[start:stop], self.ids[start:stop], self.refs[start:stop], spec)


def eval_set(lm, kind: str = "mix", n: int = 12, seed: int = 0, max_prompt_tokens: int = 96) -> EvalSet:
    """``n`` evaluation prompts (earlyexit.data) with ids and references, deterministic by seed."""
    ps = load_prompts(kind, n, seed, tokenizer=lm.tokenizer, max_prompt_tokens=max_prompt_tokens)
    ids = encode(ps, lm.tokenizer, max_prompt_tokens)
    refs = [list(lm.tokenizer(p.reference, add_special_tokens=False)["input_ids"]) or None
            if p.reference else None for p in ps]
    spec = {"kind": kind, "n": n, "seed": seed, "max_prompt_tokens": max_prompt_tokens,
            "sha256": ps.meta["sha256"]}
    return EvalSet(list(ps), ids, refs, spec)


def _kw(rule_kw) -> dict:
    """rule_kw as plain data with lists for tuples (so that it hashes and prints the same way)."""
    out = {}
    for k, v in sorted((rule_kw or {}).items()):
        out[k] = list(v) if isinstance(v, tuple) else v
    return out


def _rule_args(rule_kw) -> dict:
    """rule_kw as the engine wants it: tuples for the tuple fields."""
    out = {}
    for k, v in (rule_kw or {}).items():
        out[k] = tuple(v) if isinstance(v, list) else v
    return out


def _join(xs) -> str:
    return " ".join(str(int(x)) for x in xs)


def split_ints(s) -> list[int]:
    """The inverse of the space-separated id strings stored in the tables."""
    if isinstance(s, float) and math.isnan(s):
        return []
    return [int(x) for x in str(s).split()] if str(s).strip() else []


def label(rule: str, strategy: str, rule_kw=None) -> str:
    kw = rule_kw or {}
    if rule == "static":
        return f"static@{kw.get('layer')}"
    if rule == "skipdecode":
        return f"skipdecode {kw.get('e_max')}->{kw.get('e_min')}"
    if "threshold" in kw:
        return f"{rule} {kw['threshold']:g} / {strategy}"
    return f"{rule} / {strategy}"


# ----------------------------------------------------------------------------------- full depth


def full_depth(lm, es: EvalSet, n_new: int) -> pd.DataFrame:
    """The full model's greedy output for every prompt (cached): columns prompt, n_gen, tokens."""
    def compute():
        tr = generate(lm, es.ids, n_new, rule="full")
        return [{"prompt": b, "n_gen": int(tr.n_new[b]), "tokens": _join(tr.sequences()[b])}
                for b in range(len(es))]

    return store.cached("full_depth", {"prompts": es.spec, "n_new": n_new}, compute, model=lm)


def _forced_refs(es: EvalSet, n_new: int, pad_id: int):
    """(force ids, targets) for teacher forcing the references; IGNORE where there is none."""
    B = len(es)
    force = torch.full((B, n_new), pad_id, dtype=torch.long)
    target = torch.full((B, n_new), IGNORE, dtype=torch.long)
    for b, ref in enumerate(es.refs):
        if ref:
            r = torch.tensor(ref[:n_new])
            force[b, : len(r)] = r
            target[b, : len(r)] = r
    return force, target


# ----------------------------------------------------------------------------------- one point


def trace_frame(lm, es: EvalSet, tr, full: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per-prompt metrics of one trace (see the module docstring for the columns)."""
    cfg = lm.config
    L = cfg.num_hidden_layers
    B, N = tr.tokens.shape
    valid = tr.valid()
    steps = valid.clone()
    steps[:, 0] = False
    c = {k: v.float() for k, v in tr.counts.items()}
    pending = np.zeros(B)
    eng = tr.meta.get("engine")
    if eng is not None and hasattr(eng.strategy, "pending"):
        for b in range(B):
            pending[b] = sum(L - lev for lev, _, _ in eng.strategy.pending[b].values())
    seqs = tr.sequences()
    rows = []
    for b in range(B):
        s = steps[b]
        n_steps = int(s.sum())
        row = {"prompt": b, "prompt_id": es.prompts[b].id, "kind": es.prompts[b].kind,
               "prompt_len": len(es.ids[b]), "n_gen": int(tr.n_new[b]), "n_steps": n_steps}
        if n_steps:
            run, rec = c["layers_run"][b, s].numpy(), c["recompute_layers"][b, s].numpy()
            cp, hd = c["copied_kv"][b, s].numpy(), c["head_checks"][b, s].numpy()
            t = torch.arange(N)[s].numpy()
            ctx = len(es.ids[b]) + t            # keys a step attends to: prompt + earlier tokens + itself
            cost = metrics.cost_summary(run, rec, cp, hd, cfg, ctx)
            ex = tr.exit_layer[b, s].numpy()
            row.update(layers=float((run + rec).mean()), own_layers=float(run.mean()),
                       recompute_layers=float(rec.mean()), copied_kv=float(cp.mean()),
                       head_checks=float(hd.mean()), exit_rate=float((ex < L).mean()),
                       exit_layer=float(ex.mean()), hole_reads=float(c["hole_reads"][b, s].mean()),
                       pending_layers=float(pending[b] / n_steps), flop_fraction=cost["flop_fraction"],
                       effective_layers=cost["effective_layers"])
        else:
            row.update({k: float("nan") for k in ("layers", "own_layers", "recompute_layers", "copied_kv",
                                                    "head_checks", "exit_rate", "exit_layer", "hole_reads",
                                                    "pending_layers", "flop_fraction", "effective_layers")})
        if full is not None:
            ref_full = split_ints(full.loc[full["prompt"] == b, "tokens"].iloc[0])
            row.update(exact_match=metrics.exact_match(seqs[b], ref_full),
                       ttd=metrics.tokens_to_divergence(seqs[b], ref_full),
                       rouge_full=metrics.textual_consistency(seqs[b], ref_full))
        ref = es.refs[b]
        row["rouge_ref"] = metrics.rouge_l(seqs[b], ref[: N]) if ref else float("nan")
        row["tokens"] = _join(seqs[b])
        row["exits"] = _join(tr.exit_layer[b, : int(tr.n_new[b])].tolist())
        rows.append(row)
    return pd.DataFrame(rows)


def run_point(lm, es: EvalSet, n_new: int, rule: str = "full", strategy: str = "naive-mask",
              rule_kw=None, with_ppl: bool = False, full: pd.DataFrame | None = None) -> pd.DataFrame:
    """Decode ``es`` with (rule, strategy) and measure it (uncached; see :func:`point`)."""
    if full is None:
        full = full_depth(lm, es, n_new)
    tr = generate(lm, es.ids, n_new, rule=rule, strategy=strategy, rule_kw=_rule_args(rule_kw))
    df = trace_frame(lm, es, tr, full)
    df["batch_tok_s"] = float(tr.n_new.sum()) / tr.wall_s
    df["wall_s"] = tr.wall_s
    if with_ppl:
        pad_id = lm.config.pad_token_id if lm.config.pad_token_id is not None else 0
        force, target = _forced_refs(es, n_new, pad_id)
        tf = generate(lm, es.ids, n_new, rule=rule, strategy=strategy, rule_kw=_rule_args(rule_kw),
                      force=force, return_logits=True, stop_at_eos=False)
        ppl = []
        for b in range(len(es)):
            keep = target[b] != IGNORE
            ppl.append(metrics.perplexity(tf.logits[b, keep], target[b, keep]) if keep.any() else float("nan"))
        df["ppl_ref"] = ppl
        # the cost of the teacher-forced pass, so that quality and cost can be read from the same run
        df["layers_tf"] = trace_frame(lm, es, tf)["layers"]
    df.insert(1, "rule", rule)
    df.insert(2, "strategy", strategy)
    df.insert(3, "label", label(rule, strategy, rule_kw))
    kw = rule_kw or {}
    df.insert(4, "threshold", float(kw.get("threshold", float("nan"))))
    df.insert(5, "rule_kw", store.canonical(_kw(rule_kw)))
    return df


def point(lm, es: EvalSet, n_new: int, rule: str = "full", strategy: str = "naive-mask", rule_kw=None,
          with_ppl: bool = False) -> pd.DataFrame:
    """:func:`run_point` through the result cache."""
    params = {"prompts": es.spec, "n_new": n_new, "rule": rule, "strategy": strategy,
              "rule_kw": _kw(rule_kw), "with_ppl": with_ppl}
    return store.cached("point", params, lambda: run_point(lm, es, n_new, rule, strategy, rule_kw, with_ppl),
                        model=lm)


def sweep(lm, es: EvalSet, n_new: int, configs, ppl_for=(), progress: bool = True) -> pd.DataFrame:
    """:func:`point` for each config (a dict with rule, strategy, rule_kw), concatenated.

    ``ppl_for``: the configs (their :func:`label`) whose reference perplexity is measured as well
    (a second, teacher-forced pass), or True for all of them.
    """
    from tqdm.auto import tqdm

    frames = []
    configs = list(configs)
    for cfg in tqdm(configs, desc="points", disable=not (progress and store._progress_enabled()), leave=False):
        rule, strategy, kw = cfg.get("rule", "full"), cfg.get("strategy", "naive-mask"), cfg.get("rule_kw")
        ppl = ppl_for is True or label(rule, strategy, kw) in set(ppl_for or ())
        frames.append(point(lm, es, n_new, rule, strategy, kw, with_ppl=ppl))
    return pd.concat(frames, ignore_index=True)


def threshold_configs(rule: str, thresholds, strategies, **rule_kw) -> list[dict]:
    """The grid thresholds × strategies for one thresholded rule (extra rule arguments shared)."""
    return [{"rule": rule, "strategy": s, "rule_kw": {**rule_kw, "threshold": float(t)}}
            for s in strategies for t in thresholds]


def summary(df: pd.DataFrame, by, values=("layers", "rouge_full", "exact_match"), seed: int = 0,
            n_boot: int = 2000) -> pd.DataFrame:
    """Mean and 95% bootstrap interval over prompts of each value, per group (wide: v, v_lo, v_hi)."""
    by = [by] if isinstance(by, str) else list(by)
    out = None
    for v in values:
        s = metrics.summarize(df, by, v, n_boot=n_boot, seed=seed).rename(
            columns={"mean": v, "lo": f"{v}_lo", "hi": f"{v}_hi", "n": f"{v}_n"})
        out = s if out is None else out.merge(s, on=by)
    return out


# ----------------------------------------------------------------------------------- consistency after the first exit


def plot_tradeoff(ax, summ: pd.DataFrame, x: str = "layers", y: str = "rouge_full", hue: str = "strategy",
                  colors: dict | None = None, markers: dict | None = None, connect: bool = True, labels: dict | None = None):
    """Mean ± 95% bootstrap interval (both axes) of ``y`` against ``x`` per group of ``hue``; points of a
    group joined in the order of ``x``. ``summ`` comes from :func:`summary`."""
    from .figures import palette

    groups = list(dict.fromkeys(summ[hue]))
    colors = colors or dict(zip(groups, palette(max(len(groups), 1))))
    for g in groups:
        d = summ[summ[hue] == g].sort_values(x)
        c = colors.get(g)
        mk = (markers or {}).get(g, "o")
        ax.errorbar(d[x], d[y], xerr=[d[x] - d[f"{x}_lo"], d[f"{x}_hi"] - d[x]],
                    yerr=[d[y] - d[f"{y}_lo"], d[f"{y}_hi"] - d[y]], fmt=mk + ("-" if connect else ""),
                    color=c, ms=3.5, lw=1.0, elinewidth=0.6, capsize=1.5, label=(labels or {}).get(g, g))
    return ax


def survival(df: pd.DataFrame, full: pd.DataFrame, L: int, horizon: int) -> pd.DataFrame:
    """Per prompt and k = 0..horizon-1: is the output still identical to the full model's k tokens
    after the first early exit? (1/0; NaN when the sequence ended before or no token exited.)

    The first exit is the first decoding step whose exit layer is < L; k = 0 is the token that step
    predicted.
    """
    rows = []
    for _, r in df.iterrows():
        ex = split_ints(r["exits"])
        toks = split_ints(r["tokens"])
        ref = split_ints(full.loc[full["prompt"] == r["prompt"], "tokens"].iloc[0])
        first = next((t for t, e in enumerate(ex) if t >= 1 and e < L), None)
        div = metrics.tokens_to_divergence(toks, ref)
        for k in range(horizon):
            t = None if first is None else first + k
            alive = t is not None and t < min(len(toks), len(ref))
            rows.append({"prompt": r["prompt"], "k": k,
                         "same": float(div > t) if alive else float("nan")})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------- provenance maps


def provenance_matrix(tr, b: int = 0, prompt_cols: int = 4) -> tuple[np.ndarray, int]:
    """The provenance map of row ``b`` (L, columns): the last ``prompt_cols`` prompt columns and every
    generated column that was written. Returns (matrix of earlyexit.cache states, first column's
    offset relative to the first generated column).
    """
    P = tr.prompt_len
    start = max(int(tr.pad[b]), P - prompt_cols)
    end = P + int(tr.n_new[b]) - 1          # the last prediction is never fed back
    return tr.state[:, b, start:end].numpy().astype(int), start - P


def provenance_map_frame(tr, b: int = 0, prompt_cols: int = 4) -> pd.DataFrame:
    """The map as a tidy table: layer (1-based), position (relative to the first generated column),
    state (int) and state name."""
    m, off = provenance_matrix(tr, b, prompt_cols)
    L, C = m.shape
    lay, col = np.meshgrid(np.arange(1, L + 1), np.arange(C), indexing="ij")
    return pd.DataFrame({"layer": lay.ravel(), "position": (col + off).ravel(), "state": m.ravel(),
                         "state_name": [STATE_NAMES[s] for s in m.ravel()]})


STATE_ORDER = (COMPUTED, COPIED, RECOMPUTED, HOLE, PAD)


def state_colors() -> dict:
    """One colour-blind-safe colour per cache state (holes white, the 'nothing' colour)."""
    from .figures import palette

    pal = palette(8)
    return {COMPUTED: pal[0], COPIED: pal[1], RECOMPUTED: pal[2], HOLE: (1.0, 1.0, 1.0), PAD: (0.85, 0.85, 0.85)}


def draw_provenance(ax, frame: pd.DataFrame, title: str | None = None, legend: bool = True,
                    states=(COMPUTED, COPIED, RECOMPUTED, HOLE)):
    """Draw a provenance map (from :func:`provenance_map_frame`) as a heatmap, layer × position."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    m = frame.pivot(index="layer", columns="position", values="state")
    cols = state_colors()
    cmap = ListedColormap([cols[s] for s in range(5)])
    x = m.columns.to_numpy()
    y = m.index.to_numpy()
    ax.pcolormesh(np.append(x, x[-1] + 1) - 0.5, np.append(y, y[-1] + 1) - 0.5, m.to_numpy(), cmap=cmap,
                  vmin=-0.5, vmax=4.5, edgecolors=(0.8, 0.8, 0.8), linewidth=0.1)
    ax.axvline(-0.5, color="black", lw=0.8)
    ax.set(xlabel="cache column (0 = first generated token's input)", ylabel="layer", xlim=(x[0] - 0.5, x[-1] + 0.5),
           ylim=(y[0] - 0.5, y[-1] + 0.5))
    if title:
        ax.set_title(title)
    if legend:
        ax.legend(handles=[Patch(facecolor=cols[s], edgecolor="0.5", lw=0.4, label=STATE_NAMES[s]) for s in states],
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return ax


def provenance_point(lm, es: EvalSet, b: int, n_new: int, rule: str, strategy: str, rule_kw=None,
                     prompt_cols: int = 4) -> pd.DataFrame:
    """The provenance map of prompt ``b`` under (rule, strategy), cached; plus the step's hole reads."""
    def compute():
        tr = generate(lm, [es.ids[b]], n_new, rule=rule, strategy=strategy, rule_kw=_rule_args(rule_kw))
        df = provenance_map_frame(tr, 0, prompt_cols)
        df["hole_reads_total"] = float(tr.counts["hole_reads"].sum())
        return df

    params = {"prompts": es.spec, "b": b, "n_new": n_new, "rule": rule, "strategy": strategy,
              "rule_kw": _kw(rule_kw), "prompt_cols": prompt_cols}
    return store.cached("provenance", params, compute, model=lm)


# ----------------------------------------------------------------------------------- attention on holes / copies


@contextmanager
def eager_attention(model):
    """Temporarily switch a HF model to eager attention (the only kind that returns its weights)."""
    old = model.config._attn_implementation
    try:
        model.set_attn_implementation("eager")
        yield model
    finally:
        model.set_attn_implementation(old)


@torch.inference_mode()
def full_attention(lm, seq: list[int]) -> np.ndarray:
    """(L, H, T, T) attention probabilities of the full model over ``seq`` (one HF forward pass)."""
    model = lm.model if hasattr(lm, "tokenizer") else lm
    x = torch.tensor([seq], device=next(model.parameters()).device)
    with eager_attention(model):
        out = model(x, attention_mask=torch.ones_like(x), output_attentions=True)
    return torch.stack([a[0].float().cpu() for a in out.attentions]).numpy()


def attention_on_states(lm, tr, b: int, prompt_ids: list[int], states=(HOLE,)) -> np.ndarray:
    """Per layer, the attention mass the FULL model puts on the cache entries of row ``b`` that are in
    ``states`` (holes, copies, ...), averaged over heads and over the generated queries that can see
    one (earlyexit.metrics.attention_mass_on). The sequence is the prompt plus the tokens the method
    generated, so the keys are the positions the method's cache holds."""
    n = int(tr.n_new[b])
    seq = list(prompt_ids) + tr.tokens[b, : n - 1].tolist()
    T = len(seq)
    if n < 2:
        return np.full(tr.num_layers, np.nan)
    P, pad = tr.prompt_len, int(tr.pad[b])
    st = tr.state[:, b, pad: pad + T].numpy()
    mask = np.isin(st, np.array(states))
    attn = full_attention(lm, seq)
    qpos = np.arange(len(prompt_ids), T)              # the generated tokens' queries
    return metrics.attention_mass_on(mask, attn[:, :, qpos, :], qpos)


def exit_state_mask(exits: list[int], L: int, prompt_len: int, T: int) -> np.ndarray:
    """(L, T) bool: the entries above each generated token's exit layer, over a sequence of ``T``
    positions whose first ``prompt_len`` are the prompt. ``exits[t]`` is the exit of the step that
    predicted token t, whose input sits at position prompt_len + t - 1; that step wrote layers
    1..exits[t] and left layers exits[t]+1..L to the strategy (a hole, a copy or a recompute)."""
    m = np.zeros((L, T), dtype=bool)
    for t, e in enumerate(exits):
        col = prompt_len + t - 1
        if t >= 1 and col < T and e < L:
            m[e:, col] = True
    return m


def attention_above_exits(lm, es: EvalSet, df: pd.DataFrame) -> pd.DataFrame:
    """Per (prompt, layer): the attention mass the FULL model puts on the entries a point's tokens
    left above their exit layer (holes for naive strategies, copies for copy-forward), when it reads
    the sequence the point generated. From a point table (its tokens and exits); nothing is decoded."""
    L = lm.config.num_hidden_layers
    rows = []
    for _, r in df.iterrows():
        b = int(r["prompt"])
        toks, exits = split_ints(r["tokens"]), split_ints(r["exits"])
        seq = list(es.ids[b]) + toks[:-1]
        T, lp = len(seq), len(es.ids[b])
        if len(toks) < 2:
            continue
        mask = exit_state_mask(exits, L, lp, T)
        attn = full_attention(lm, seq)
        qpos = np.arange(lp, T)
        mass = metrics.attention_mass_on(mask, attn[:, :, qpos, :], qpos)
        for l, m in enumerate(mass):
            rows.append({"prompt": b, "layer": l + 1, "mass": float(m)})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------- the scene


def scene(lm, ids: list[int], n_new: int, exits: tuple, strategies) -> pd.DataFrame:
    """One prompt, one scripted exit pattern (``exits[t]`` for generated token t), several strategies.

    For each strategy two runs: a free one (its own tokens) and one teacher-forced on the full
    model's tokens (so positions line up), which gives KL(full ‖ strategy) of every next-token
    distribution. Rows: strategy, t, token, same (token equals the full model's), kl, exit.
    """
    L = lm.config.num_hidden_layers
    full = generate(lm, [ids], n_new, rule="full", stop_at_eos=False, return_logits=True)
    ftoks = full.tokens[0].tolist()
    rows = [{"strategy": "full depth", "t": t, "token": ftoks[t], "same": 1.0, "kl": 0.0, "exit": L}
            for t in range(n_new)]
    for s in strategies:
        free = generate(lm, [ids], n_new, rule="scripted", strategy=s, rule_kw={"exits": tuple(exits)},
                        stop_at_eos=False)
        tf = generate(lm, [ids], n_new, rule="scripted", strategy=s, rule_kw={"exits": tuple(exits)},
                      stop_at_eos=False, force=full.tokens, return_logits=True)
        kl = metrics.kl_divergence(full.logits[0], tf.logits[0])
        toks = free.tokens[0].tolist()
        div = metrics.tokens_to_divergence(toks, ftoks)
        rows += [{"strategy": s, "t": t, "token": toks[t], "same": float(t < div), "kl": float(kl[t]),
                  "exit": int(tf.exit_layer[0, t])} for t in range(n_new)]
    return pd.DataFrame(rows)


def scene_point(lm, es: EvalSet, b: int, n_new: int, exits: tuple, strategies) -> pd.DataFrame:
    """:func:`scene` on prompt ``b`` of ``es``, through the result cache."""
    params = {"prompts": es.spec, "b": b, "n_new": n_new, "exits": list(exits), "strategies": list(strategies)}
    return store.cached("scene", params, lambda: scene(lm, es.ids[b], n_new, tuple(exits), strategies), model=lm)


@torch.inference_mode()
def lens_exit_layer(lm, ids: list[int], tokens: list[int], t: int, min_layer: int = 1) -> int | None:
    """The lowest layer >= ``min_layer`` (below the top) whose prediction, read through the final norm
    and the head, is the full model's token ``tokens[t]`` for the step that produces it, on an intact
    cache (the oracle's exit for that one step). None if only the top layer predicts it."""
    model = lm.model if hasattr(lm, "tokenizer") else lm
    x = torch.tensor([list(ids) + list(tokens[:t])], device=next(model.parameters()).device)
    hs = model(x, attention_mask=torch.ones_like(x), output_hidden_states=True).hidden_states
    L = model.config.num_hidden_layers
    for l in range(max(1, min_layer), L):          # hidden_states[l] is the output of layer l
        logits = model.lm_head(model.model.norm(hs[l][:, -1]))
        if int(logits.argmax(-1)) == int(tokens[t]):
            return l
    return None


def column_attention(lm, seq: list[int], col: int) -> np.ndarray:
    """(L, T - col - 1): the attention mass (mean over heads) each later query of ``seq`` puts on
    position ``col``, per layer, in the full model."""
    attn = full_attention(lm, seq)                       # (L, H, T, T)
    return attn[:, :, col + 1:, col].mean(axis=1)


# ----------------------------------------------------------------------------------- drift


@torch.inference_mode()
def true_cache(lm, seq: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V (L, H_kv, T, d) of the full model over ``seq``: the cache the invariant asks for."""
    model = lm.model if hasattr(lm, "tokenizer") else lm
    x = torch.tensor([seq], device=next(model.parameters()).device)
    pkv = model(x, attention_mask=torch.ones_like(x), use_cache=True).past_key_values
    k = torch.stack([layer.keys[0] for layer in pkv.layers]).float().cpu()
    v = torch.stack([layer.values[0] for layer in pkv.layers]).float().cpu()
    return k, v


def drift(lm, prompt_ids: list[int], tr, b: int, full_logits: torch.Tensor, full_tokens: list[int]) -> pd.DataFrame:
    """Per generated position t of row ``b`` of a run teacher-forced on ``full_tokens``:

    kl        KL(full ‖ method) of the next-token distribution (nats)
    exit      the step's exit layer
    k_err_*   relative error ||K − K*|| / ||K*|| of the cache entries at this token's column against
              the full model's own cache over the same tokens, averaged over the layers whose entry is
              computed / copied (NaN where none)
    v_err_*   the same for V
    copies_seen  copied entries (layer, column) a step at this position can attend to
    """
    n = len(full_tokens)
    eng = tr.meta["engine"]
    P, pad = tr.prompt_len, int(tr.pad[b])
    lp = len(prompt_ids)
    seq = list(prompt_ids) + list(full_tokens[: n - 1])
    kt, vt = true_cache(lm, seq)                                     # (L, Hkv, T, d)
    T = len(seq)
    km = eng.cache.k[:, b, :, pad: pad + T].float().cpu()            # (L, Hkv, T, d)
    vm = eng.cache.v[:, b, :, pad: pad + T].float().cpu()
    st = tr.state[:, b, pad: pad + T]                                # (L, T)

    def rel(a, ref):
        return ((a - ref).norm(dim=(1, 3)) / ref.norm(dim=(1, 3)).clamp_min(1e-12)).numpy()   # (L, T)

    ek, ev = rel(km, kt), rel(vm, vt)
    kl = metrics.kl_divergence(full_logits[b, :n], tr.logits[b, :n])
    copies = np.cumsum((st == COPIED).sum(0).numpy())
    rows = []
    for t in range(n):
        col = lp + t - 1            # the column of the input that predicted token t (t >= 1)
        row = {"prompt": b, "t": t, "kl": float(kl[t]), "exit": int(tr.exit_layer[b, t])}
        if t >= 1 and col < T:
            s = st[:, col].numpy()
            for name, code in (("computed", COMPUTED), ("copied", COPIED)):
                sel = np.isin(s, (code, RECOMPUTED)) if code == COMPUTED else s == code
                row[f"k_err_{name}"] = float(ek[sel, col].mean()) if sel.any() else float("nan")
                row[f"v_err_{name}"] = float(ev[sel, col].mean()) if sel.any() else float("nan")
            row["copies_seen"] = int(copies[col])
        else:
            row.update(k_err_computed=float("nan"), v_err_computed=float("nan"), k_err_copied=float("nan"),
                       v_err_copied=float("nan"), copies_seen=0)
        rows.append(row)
    return pd.DataFrame(rows)


def drift_point(lm, es: EvalSet, n_new: int, configs) -> pd.DataFrame:
    """:func:`drift` for every prompt and config, teacher-forced on the full model's own continuation
    (generated with ``stop_at_eos=False``, so every position exists for every method). Cached per config."""
    def full_run():
        return generate(lm, es.ids, n_new, rule="full", stop_at_eos=False, return_logits=True)

    holder = {}

    def one(cfg):
        def compute():
            if "full" not in holder:
                holder["full"] = full_run()
            fr = holder["full"]
            force = fr.tokens.clone()
            tr = generate(lm, es.ids, n_new, rule=cfg["rule"], strategy=cfg["strategy"],
                          rule_kw=_rule_args(cfg.get("rule_kw")), force=force, return_logits=True,
                          stop_at_eos=False)
            frames = [drift(lm, es.ids[b], tr, b, fr.logits, fr.tokens[b].tolist()) for b in range(len(es))]
            df = pd.concat(frames, ignore_index=True)
            df.insert(0, "label", label(cfg["rule"], cfg["strategy"], cfg.get("rule_kw")))
            df.insert(1, "strategy", cfg["strategy"])
            return df

        params = {"prompts": es.spec, "n_new": n_new, "rule": cfg["rule"], "strategy": cfg["strategy"],
                  "rule_kw": _kw(cfg.get("rule_kw"))}
        return store.cached("drift", params, compute, model=lm)

    return pd.concat([one(c) for c in configs], ignore_index=True)


# ----------------------------------------------------------------------------------- wall clock


def time_point(lm, es: EvalSet, n_new: int, rule: str = "full", strategy: str = "naive-mask", rule_kw=None,
               batch: int = 1, repeats: int = 2) -> pd.DataFrame:
    """Wall-clock decoding speed (cached): the first ``batch`` prompts decoded together, ``n_new``
    tokens each without stopping at EOS, best of ``repeats``. The prompt pass is timed separately
    (a one-token run) and taken out, so ``tok_s`` is decoding steps per second, all rows counted.
    At batch 1 each of the set's prompts is timed on its own (one row each)."""
    def run(ids):
        best = math.inf
        best_pre = math.inf
        layers = heads = 0.0
        for _ in range(repeats):
            pre = generate(lm, ids, 1, rule="full", stop_at_eos=False)
            tr = generate(lm, ids, n_new, rule=rule, strategy=strategy, rule_kw=_rule_args(rule_kw),
                          stop_at_eos=False)
            best, best_pre = min(best, tr.wall_s), min(best_pre, pre.wall_s)
            s = tr.valid().clone()
            s[:, 0] = False
            layers = float((tr.counts["layers_run"] + tr.counts["recompute_layers"])[s].mean())
            heads = float(tr.counts["head_checks"][s].mean())
        steps = len(ids) * (n_new - 1)
        return {"batch": len(ids), "wall_s": best, "prefill_s": best_pre,
                "tok_s": steps / max(best - best_pre, 1e-9), "layers": layers, "head_checks": heads}

    def compute():
        if batch == 1:
            return [{"prompt": b, **run([es.ids[b]])} for b in range(len(es))]
        return [{"prompt": -1, **run(es.ids[:batch])}]

    params = {"prompts": es.spec, "n_new": n_new, "rule": rule, "strategy": strategy, "rule_kw": _kw(rule_kw),
              "batch": batch, "repeats": repeats, "threads": torch.get_num_threads()}
    df = store.cached("timing", params, compute, model=lm)
    df.insert(0, "label", label(rule, strategy, rule_kw))
    df.insert(1, "rule", rule)
    df.insert(2, "strategy", strategy)
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
            kw = {"exits": tuple(scripts[b][:n_new])}
            best, best_pre, layers = math.inf, math.inf, 0.0
            for _ in range(repeats):
                pre = generate(lm, [es.ids[b]], 1, rule="full", stop_at_eos=False)
                tr = generate(lm, [es.ids[b]], n_new, rule="scripted", strategy=strategy, rule_kw=kw,
                              stop_at_eos=False)
                best, best_pre = min(best, tr.wall_s), min(best_pre, pre.wall_s)
                s = tr.valid().clone()
                s[:, 0] = False
                layers = float((tr.counts["layers_run"] + tr.counts["recompute_layers"])[s].mean())
            rows.append({"prompt": b, "batch": 1, "wall_s": best, "prefill_s": best_pre,
                         "tok_s": (n_new - 1) / max(best - best_pre, 1e-9), "layers": layers})
        return rows

    params = {"prompts": es.spec, "n_new": n_new, "strategy": strategy, "repeats": repeats,
              "scripts": {str(b): scripts[b][:n_new] for b in range(len(es))}, "threads": torch.get_num_threads()}
    out = store.cached("timing_replay", params, compute, model=lm)
    out.insert(0, "strategy", strategy)
    return out


def flop_breakdown(lm, df: pd.DataFrame) -> pd.DataFrame:
    """Per row of a point table: the FLOPs per decoding step of decoder layers (own and recompute),
    K/V copies and head evaluations, as fractions of a full-depth step at the same context."""
    cfg = lm.config
    L = cfg.num_hidden_layers
    ctx = df["prompt_len"] + df["n_steps"] / 2 + 1          # mean context of the decoding steps
    lf = np.array([metrics.layer_flops(cfg, c) for c in ctx])
    hf = metrics.head_flops(cfg)
    full = L * lf + hf
    return pd.DataFrame({
        "layers": df["own_layers"] * lf / full,
        "recompute": df["recompute_layers"] * lf / full,
        "kv_copies": df["copied_kv"] * metrics.kv_projection_flops(cfg) / full,
        "head": df["head_checks"] * hf / full,
    }, index=df.index)


def head_in_layers(lm, ctx: int = 64) -> float:
    """How many decoder layers one evaluation of the shared head costs (FLOPs, at context ``ctx``)."""
    return metrics.head_flops(lm.config) / metrics.layer_flops(lm.config, ctx)


# ----------------------------------------------------------------------------------- lazy recompute audit


def lazy_audit(lm, ids: list[int], n_new: int, rule: str, rule_kw=None) -> dict:
    """Decode one prompt with lazy recompute, complete the pending recomputes (``flush``) and compare
    the whole cache with the full model's own cache over the same tokens.

    Returns the entries pending before the flush, the holes left after it, the recomputed entries,
    and the largest absolute difference of K and V from the full model's cache.
    """
    tr = generate(lm, [ids], n_new, rule=rule, strategy="lazy-recompute", rule_kw=_rule_args(rule_kw),
                  stop_at_eos=False)
    eng = tr.meta["engine"]
    n = int(tr.n_new[0])
    P, pad = tr.prompt_len, int(tr.pad[0])
    T = len(ids) + n - 1
    before = eng.cache.state[:, 0, pad: pad + T].clone()
    eng.strategy.flush(eng)
    after = eng.cache.state[:, 0, pad: pad + T]
    seq = list(ids) + tr.tokens[0, : n - 1].tolist()
    kt, vt = true_cache(lm, seq)
    km = eng.cache.k[:, 0, :, pad: pad + T].float().cpu()
    vm = eng.cache.v[:, 0, :, pad: pad + T].float().cpu()
    return {"pending_before_flush": int((before == HOLE).sum()), "holes_after_flush": int((after == HOLE).sum()),
            "recomputed_entries": int((after == RECOMPUTED).sum()), "entries": int(after.numel()),
            "max_abs_k": float((km - kt).abs().max()), "max_abs_v": float((vm - vt).abs().max()),
            "max_abs_ref": float(kt.abs().max())}


# ----------------------------------------------------------------------------------- SkipDecode schedule


def skip_schedule(L: int, n_new: int, e_max: int, e_min: int, horizon: int, warmup: int = 1) -> pd.DataFrame:
    """The layers SkipDecode runs for each generated token t >= 1: rows (t, layer 1..L, runs, budget)."""
    from .exits import make_rule

    rule = make_rule("skipdecode", L, e_max=e_max, e_min=e_min, horizon=horizon, warmup=warmup)
    rows = []
    for t in range(1, n_new):
        run = set(rule.layers(t))
        rows += [{"t": t, "layer": l + 1, "runs": l in run, "budget": rule.budget(t)} for l in range(L)]
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------- self-speculation


def spec_point(lm, es: EvalSet, n_new: int, exit_layer: int, draft_len: int, repeats: int = 1,
               peer: bool = True) -> pd.DataFrame:
    """LayerSkip self-speculative decoding at (E, d) on every prompt of ``es`` (cached), timed side by side
    with full-depth decoding (this engine) and, if ``peer``, with transformers'
    ``generate(assistant_early_exit=E)`` at the same draft length: for each prompt and repeat the three run
    back to back, ``n_new`` tokens each without stopping at EOS, and the fastest repeat counts.

    One row per prompt: ``full_s``, ``spec_s``, ``hf_s`` (wall seconds, prompt pass included, the same for
    all three), ``speedup`` (full_s / spec_s), ``vs_hf`` (hf_s / spec_s), ``lossless`` (our tokens equal
    full depth's), ``hf_lossless``, ``acceptance`` (accepted / drafted), ``rounds``, ``tokens_per_round``,
    ``layers`` (decoder-layer evaluations per decoding step, draft + verify, prompt pass excluded as for
    every other method), ``heads`` (head evaluations per decoding step)."""
    from .speculative import hf_assistant_early_exit, self_speculative

    def compute():
        rows = []
        for b, ids in enumerate(es.ids):
            best = {"full": math.inf, "spec": math.inf, "hf": math.inf}
            for _ in range(repeats):
                full = generate(lm, [ids], n_new, rule="full", stop_at_eos=False)
                best["full"] = min(best["full"], full.wall_s)
                sp = self_speculative(lm, ids, n_new, exit_layer, draft_len, stop_at_eos=False)
                best["spec"] = min(best["spec"], sp.wall_s)
                if peer:
                    hf_tokens, hf_s = hf_assistant_early_exit(lm, ids, n_new, exit_layer, draft_len,
                                                              stop_at_eos=False)
                    best["hf"] = min(best["hf"], hf_s)
            ref = full.sequences()[0]
            rows.append({"prompt": b, "E": exit_layer, "d": draft_len, "n_new": len(sp.tokens),
                         "full_s": best["full"], "spec_s": best["spec"],
                         "hf_s": best["hf"] if peer else float("nan"),
                         "lossless": bool(sp.tokens == ref),
                         "hf_lossless": bool(hf_tokens == ref) if peer else float("nan"),
                         "acceptance": sp.acceptance, "rounds": sp.rounds,
                         "tokens_per_round": (len(sp.tokens) - 1) / max(sp.rounds, 1),
                         # per decoding step, like every other method: the prompt pass (which also
                         # predicts token 0) is left out
                         "layers": (sp.layer_evals - len(ids) * lm.num_layers) / max(len(sp.tokens) - 1, 1),
                         "heads": (sp.head_evals - 1) / max(len(sp.tokens) - 1, 1)})
        return rows

    params = {"prompts": es.spec, "n_new": n_new, "E": exit_layer, "d": draft_len, "repeats": repeats,
              "peer": peer, "threads": torch.get_num_threads()}
    df = store.cached("spec_point", params, compute, model=lm)
    df["speedup"] = df["full_s"] / df["spec_s"]
    df["vs_hf"] = df["hf_s"] / df["spec_s"]
    df["full_tok_s"] = df["n_new"] / df["full_s"]
    df["spec_tok_s"] = df["n_new"] / df["spec_s"]
    df["hf_tok_s"] = df["n_new"] / df["hf_s"]
    return df


@torch.inference_mode()
def generated_agreement(lm, es: EvalSet, n_new: int) -> pd.DataFrame:
    """Per prompt and layer, along the full model's own greedy output (teacher-forced): the fraction of
    generated positions where the exit after that layer (final norm + shared head) predicts the full model's
    next token. With E layers this is the chance that a one-token draft is accepted. Cached."""
    from .train import exit_logits, forward_layers

    full = full_depth(lm, es, n_new)

    def compute():
        rows = []
        for b, ids in enumerate(es.ids):
            gen = [int(t) for t in str(full.loc[full.prompt == b, "tokens"].iloc[0]).split()]
            seq = torch.tensor([ids + gen], device=lm.device)
            hs = forward_layers(lm.model, seq)
            P_ = len(ids)
            sl = slice(P_ - 1, P_ - 1 + len(gen))
            final = exit_logits(lm.model, hs[len(hs) - 1][:, sl]).argmax(-1)
            for l in range(len(hs)):
                pred = exit_logits(lm.model, hs[l][:, sl]).argmax(-1)
                rows.append({"prompt": b, "layer": l + 1, "agreement": float((pred == final).float().mean())})
        return rows

    return store.cached("generated_agreement", {"prompts": es.spec, "n_new": n_new}, compute, model=lm)

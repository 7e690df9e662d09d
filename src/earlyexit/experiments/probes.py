"""Probes of what the cache holds and what attention does with it.

Provenance maps (which entry was computed, copied, recomputed or left a hole), the attention the full
model puts on the entries a method left above its exits, the one-prompt scene of chapter 2, the
logit-lens exit of one step, the SkipDecode schedule, and per-layer agreement with the last layer along
the full model's own output.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pandas as pd
import torch

from ..engine.cache import STATE_NAMES
from ..engine import DecodeConfig, decode
from ..engine.adapter import unwrap
from . import metrics
from .. import store
from .points import full_depth, point_params, split_ints
from .evalset import EvalSet


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


def provenance_matrix(tr, b: int = 0, prompt_cols: int = 4) -> tuple[np.ndarray, int]:
    """The provenance map of row ``b`` (L, columns): the last ``prompt_cols`` prompt columns and every
    generated column that was written. Returns (matrix of earlyexit.engine.cache states, first column's
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


def provenance_point(lm, es: EvalSet, b: int, n_new: int, cfg: DecodeConfig, prompt_cols: int = 4) -> pd.DataFrame:
    """The provenance map of prompt ``b`` under ``cfg``, cached; plus the run's hole reads."""
    def compute():
        tr = decode(lm, [es.ids[b]], cfg, n_new)
        df = provenance_map_frame(tr, 0, prompt_cols)
        df["hole_reads_total"] = float(tr.counts["hole_reads"].sum())
        return df

    params = point_params(es, n_new, cfg, b=b, prompt_cols=prompt_cols)
    return store.cached("provenance", params, compute, model=lm)


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
    model = unwrap(lm)
    x = torch.tensor([seq], device=next(model.parameters()).device)
    with eager_attention(model):
        out = model(x, attention_mask=torch.ones_like(x), output_attentions=True)
    return torch.stack([a[0].float().cpu() for a in out.attentions]).numpy()


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


def scene(lm, ids: list[int], n_new: int, exits: tuple, strategies) -> pd.DataFrame:
    """One prompt, one scripted exit pattern (``exits[t]`` for generated token t), several strategies.

    For each strategy two runs: a free one (its own tokens) and one teacher-forced on the full
    model's tokens (so positions line up), which gives KL(full ‖ strategy) of every next-token
    distribution. Rows: strategy, t, token, same (token equals the full model's), kl, exit.
    """
    L = lm.config.num_hidden_layers
    full = decode(lm, [ids], DecodeConfig.full(), n_new, stop_at_eos=False, return_logits=True)
    ftoks = full.tokens[0].tolist()
    rows = [{"strategy": "full depth", "t": t, "token": ftoks[t], "same": 1.0, "kl": 0.0, "exit": L}
            for t in range(n_new)]
    for s in strategies:
        cfg = DecodeConfig.early_exit("scripted", s, exits=tuple(exits))
        free = decode(lm, [ids], cfg, n_new, stop_at_eos=False)
        tf = decode(lm, [ids], cfg, n_new, stop_at_eos=False, force=full.tokens, return_logits=True)
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
    model = unwrap(lm)
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


def skip_schedule(L: int, n_new: int, e_max: int, e_min: int, horizon: int, warmup: int = 1) -> pd.DataFrame:
    """The layers SkipDecode runs for each generated token t >= 1: rows (t, layer 1..L, runs, budget)."""
    from ..engine.rules import make_rule

    rule = make_rule("skipdecode", L, e_max=e_max, e_min=e_min, horizon=horizon, warmup=warmup)  # checks the args
    rows = []
    for t in range(1, n_new):
        run = set(rule.plan(t))
        rows += [{"t": t, "layer": l + 1, "runs": l in run, "budget": rule.budget(t)} for l in range(L)]
    return pd.DataFrame(rows)


@torch.inference_mode()
def generated_agreement(lm, es: EvalSet, n_new: int) -> pd.DataFrame:
    """Per prompt and layer, along the full model's own greedy output (teacher-forced): the fraction of
    generated positions where the exit after that layer (final norm + shared head) predicts the full model's
    next token. With E layers this is the chance that a one-token draft is accepted. Cached."""
    from ..training.forward import exit_logits, forward_layers

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



def skip_search(lm, n_blocks: int, block_tokens: int, n_skip: int, seed: int = 0) -> pd.DataFrame:
    """The training-free drafter's layers: :func:`~earlyexit.engine.speculative.choose_skipped_layers` on
    ``n_blocks`` blocks of ``block_tokens`` tokens of the training stream (never an evaluation prompt), up to
    ``n_skip`` layers. One row per size: ``n_skip``, ``skip`` (space-separated layer numbers, 1-based),
    ``agreement`` (fraction of the full model's next-token predictions kept). Cached."""
    from ..corpus import token_stream
    from ..engine.speculative import choose_skipped_layers

    def compute():
        blocks = token_stream(lm.tokenizer, block_tokens, seed)
        seqs = [next(blocks).tolist() for _ in range(n_blocks)]
        path = choose_skipped_layers(lm, seqs, n_skip, progress=True)
        return [{"n_skip": p["n_skip"], "skip": " ".join(map(str, p["skip"])), "agreement": p["agreement"]}
                for p in path]

    params = {"blocks": n_blocks, "tokens": block_tokens, "n_skip": n_skip, "seed": seed}
    return store.cached("skip_search", params, compute, model=lm)

"""LayerSkip self-speculative decoding (Elhoushi et al., 2024): draft with the first E layers,
verify with the rest, over ONE shared KV cache. Lossless under greedy decoding.

One round, with the last accepted token ``x`` at cache column ``c`` (not yet run):

1. **Draft.** Run ``x`` and then each new draft token through layers 1..E only, reading the shared
   head at layer E: drafts ``y_1..y_d``. Their layer-E hidden states are kept (the exit-query cache)
   and their K/V are written at layers 1..E.
2. **Verify.** Run ``y_d`` through layers 1..E too, then the chunk of columns ``c..c+d`` (``x,
   y_1..y_d``) through layers E+1..L in one pass, starting from the kept layer-E states. This writes
   the upper layers' K/V and gives the full model's predictions ``z_1..z_{d+1}``.
3. **Accept** the longest prefix with ``y_i = z_i``, then emit ``z_{a+1}`` (the correction, or the bonus
   token when all ``d`` drafts were accepted). Columns after the last accepted token are cut from the
   cache; ``z_{a+1}`` becomes the next round's ``x``.

Every emitted token is the full model's greedy prediction computed over an exact cache, so the
output equals full-depth greedy decoding token for token.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..clock import now
from ..progress import bar as progress_bar
from .adapter import Adapter, adapter
from .cache import COMPUTED
from .loop import Engine
from .fill import NaiveMask
from .rules import FullDepth


@dataclass
class SpecRun:
    """One prompt's self-speculative decoding: the tokens, and per round what it drafted and cost."""

    tokens: list[int]
    wall_s: float
    round_start: list[int] = field(default_factory=list)   # index in ``tokens`` of each round's first token
    accepted: list[int] = field(default_factory=list)      # drafts accepted in each round
    drafted: list[int] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)        # decoder-layer evaluations of each round
    heads: list[int] = field(default_factory=list)         # head evaluations of each round
    prompt_layers: int = 0
    prefill_s: float = 0.0                                 # wall seconds of the prompt pass (within wall_s)
    cache_len: int = 0
    state: torch.Tensor | None = None                      # (L, C) provenance map of the shared cache
    calls: dict = field(default_factory=dict)              # what ran, by kind and size (see Engine.calls)
    step_s: list[float] = field(default_factory=list)      # wall seconds of each round (draft, verify, accept)


def shortlist_ids(lm, A: Adapter, K: int) -> torch.Tensor:
    """The ``K`` token ids most frequent in the training stream (ties to the lower id), sorted: the rows of a
    shortlist draft head. Needs the model's tokenizer (a LoadedModel); ``K`` at least the head's rows means
    every row."""
    from ..corpus import token_counts

    tok = getattr(lm, "tokenizer", None)
    if tok is None:
        raise ValueError("a shortlist draft head counts token frequencies with the model's tokenizer: pass the "
                         "LoadedModel (earlyexit.engine.models.load_model), not a bare model")
    V = A.head.weight.shape[0]
    counts = token_counts(tok)[:V]
    order = torch.sort(-counts, stable=True).indices[: min(K, V)]
    return torch.sort(order).values


def check_draft(L: int, exit_layer, draft_len, skip=()) -> None:
    top = L if skip else L - 1      # a draft must leave some layer out: above its exit, or skipped
    if not isinstance(exit_layer, int) or isinstance(exit_layer, bool) or not 1 <= exit_layer <= top:
        raise ValueError(f"exit_layer E must be an int in [1, {top}] (L = {L}"
                         + (", E = L allowed with skipped layers" if skip else "") + f"), got {exit_layer!r}")
    if not isinstance(draft_len, int) or isinstance(draft_len, bool) or draft_len < 1:
        raise ValueError(f"draft_len must be an int >= 1, got {draft_len!r}")
    if skip and not all(1 <= n < exit_layer for n in skip):
        raise ValueError(f"skipped layers must lie in [1, {exit_layer - 1}] (below the draft's exit layer "
                         f"{exit_layer}), got {sorted(skip)}")


@torch.inference_mode()
def self_speculative(A: Adapter, prompt: list[int], max_new_tokens: int, exit_layer: int, draft_len: int, *,
                     eos_set: set, progress: bool = False, shortlist: torch.Tensor | None = None,
                     confidence: float = 0.0, skip: tuple = ()) -> SpecRun:
    """Greedy self-speculative decoding of one (checked) prompt; see the module docstring.

    ``shortlist`` (token ids): drafts are the argmax over these rows of the head only (FR-Spec), tallied as
    ``head:draft_short:1``; verification reads the full head, so the output stays the full model's.
    ``confidence`` > 0: a round stops drafting after a draft whose probability (softmax over the rows the
    draft read) is below it, so rounds draft between 1 and ``draft_len`` tokens.
    ``skip`` (layer numbers, 1-based): the draft also leaves these layers out. Every layer from the lowest
    skipped one (``s0``) up then sees a different residual stream in the draft, so verification runs layers
    s0+1..L (not E+1..L) over the round's columns, rewriting the draft's K/V there; the draft never runs a
    skipped layer, so it never reads one of its holes."""
    L = A.L
    P = len(prompt)
    cap = P + max_new_tokens + draft_len + 1
    E, d = exit_layer, draft_len
    skipped = {n - 1 for n in skip}
    s0 = min(skipped | {E})                                    # lowest layer (0-based) the draft leaves out
    upper = [l for l in range(s0, E) if l not in skipped]      # draft layers above it
    eng = Engine(A, 1, cap, FullDepth(L), NaiveMask(), 1)
    dev = A.device
    row = slice(None)
    pos_all = torch.arange(cap, device=dev)[None]

    def run(layers, h, cols):
        cols_t = torch.as_tensor(cols)
        cos, sin = A.rope(h, pos_all[:, cols_t])
        for l in layers:
            h = eng.layer(l, h, row, cols_t if len(cols) > 1 else cols[0], cos, sin, COMPUTED, audit=False)
        return h

    if shortlist is not None:
        ids_short = torch.as_tensor(shortlist, dtype=torch.long, device=dev)
        head_short = A.sub_head(ids_short)        # the draft head: the shortlist's rows of the LM head

    def draft_logits(hE):
        if shortlist is None:
            return eng.head(hE, "draft")
        eng.tally(f"head:draft_short:{hE.shape[0]}")
        return head_short(hE)

    t0 = now(dev)
    h = run(range(L), A.embed(torch.tensor([prompt], device=dev)), list(range(P)))
    x = int(eng.head(h[:, -1], "out").argmax(-1))
    prefill_s = now(dev) - t0
    eng.phase = "decode"
    out = [x]
    sp = SpecRun(tokens=out, wall_s=0.0, prompt_layers=P * L, prefill_s=prefill_s)
    c = P
    bar = progress_bar(total=max_new_tokens, show=progress, desc=f"self-spec E={E} d={d}", leave=False)
    bar.update(1)
    last = now(dev)
    while len(out) < max_new_tokens and not (eos_set and out[-1] in eos_set):
        eng.tally("steps")
        # 1. draft
        drafts, h_exit = [], []
        tok = x
        for i in range(d):
            hs = run(range(s0), A.embed(torch.tensor([[tok]], device=dev)), [c + i])
            h_exit.append(hs)                                  # exact up to s0: verification starts here
            hE = run(upper, hs, [c + i]) if upper else hs
            logits = draft_logits(hE[:, -1])
            j = int(logits.argmax(-1))
            tok = int(ids_short[j]) if shortlist is not None else j
            drafts.append(tok)
            if confidence > 0 and float(torch.softmax(logits.float(), -1)[0, j]) < confidence:
                break
        k = len(drafts)          # drafted this round (d, or fewer when the confidence fell)
        # 2. verify: y_k through the lower layers, then all k+1 columns through the upper layers
        h_exit.append(run(range(s0), A.embed(torch.tensor([[drafts[-1]]], device=dev)), [c + k]))
        hv = run(range(s0, L), torch.cat(h_exit, dim=1), list(range(c, c + k + 1)))
        z = eng.head(hv[0], "verify").argmax(-1).tolist()     # z[i] = full prediction after column c+i
        # 3. accept
        a = 0
        while a < k and drafts[a] == z[a]:
            a += 1
        new = drafts[:a] + [z[a]]
        sp.round_start.append(len(out))
        sp.drafted.append(k)
        sp.accepted.append(a)
        sp.layers.append(k * (s0 + len(upper)) + s0 + (k + 1) * (L - s0))
        sp.heads.append(k + (k + 1))
        eng.cache.truncate(c + a + 1)
        c += a + 1
        for t in new:
            if len(out) >= max_new_tokens:
                break
            out.append(t)
            bar.update(1)
            if eos_set and t in eos_set:
                break
        x = out[-1]
        tn = now(dev)
        sp.step_s.append(tn - last)
        last = tn
    bar.close()
    sp.wall_s = now(dev) - t0
    sp.cache_len = c
    sp.state = eng.cache.state[:, 0].cpu()
    sp.calls = {ph: dict(sorted(c.items())) for ph, c in eng.calls.items()}
    return sp


def hf_generate(model, prompt: list[int], max_new_tokens: int, *, stop_at_eos: bool = True,
                **generate_kw) -> tuple[list[int], float]:
    """transformers' own greedy ``generate`` on one prompt (with ``generate_kw`` passed through), timed.
    Without extra arguments it is the peer of this engine's full depth. Returns (tokens, wall seconds)."""
    dev = next(model.parameters()).device
    x = torch.tensor([prompt], device=dev)
    kw = dict(attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
              pad_token_id=model.config.pad_token_id, **generate_kw)
    if not stop_at_eos:
        kw["eos_token_id"] = None
    t0 = now(dev)
    with torch.inference_mode():
        out = model.generate(x, **kw)
    return out[0, len(prompt):].tolist(), now(dev) - t0


def hf_assistant_early_exit(model, prompt: list[int], max_new_tokens: int, exit_layer: int, draft_len: int,
                            *, stop_at_eos: bool = True) -> tuple[list[int], float]:
    """The peer: transformers' own self-speculation, ``generate(assistant_early_exit=E)``, with a
    constant draft length and its confidence cut-off disabled. Returns (tokens, wall seconds)."""
    return hf_generate(model, prompt, max_new_tokens, stop_at_eos=stop_at_eos, assistant_early_exit=exit_layer,
                       num_assistant_tokens=draft_len, num_assistant_tokens_schedule="constant",
                       assistant_confidence_threshold=0.0)


@torch.inference_mode()
def choose_skipped_layers(lm, sequences: list[list[int]], n_skip: int, candidates=None,
                          progress: bool = False) -> list[dict]:
    """A layer-skipping draft chosen without training (Draft & Verify's idea, searched greedily): starting from
    the full model, drop one layer at a time, each time the one whose removal keeps the model's next-token
    prediction (argmax through the full head) closest to the full model's, measured teacher-forced at every
    position of ``sequences`` (equal-length token-id lists from training text, never evaluation prompts).

    ``candidates``: layer numbers (1..L) that may be dropped (default: all but the first and the last).
    Returns the path, one row per size: ``{"n_skip": k, "skip": (layers, 1-based, sorted), "agreement": a}``
    (row 0 is the full model, agreement 1). Cost: about L/2 layer passes per candidate per step, because the
    hidden states below a candidate are reused."""
    A = adapter(lm).for_inference()
    L = A.L
    if len({len(s) for s in sequences}) != 1 or not sequences or not sequences[0]:
        raise ValueError("sequences must be non-empty token-id lists of one length")
    cand = sorted(set(candidates) if candidates is not None else range(2, L))
    if any(not isinstance(n, int) or not 1 <= n <= L for n in cand):
        raise ValueError(f"candidate layers must be ints in [1, {L}], got {cand}")
    if not isinstance(n_skip, int) or not 0 <= n_skip <= len(cand):
        raise ValueError(f"n_skip must be an int in [0, {len(cand)}] (the candidate layers), got {n_skip!r}")
    ids = torch.tensor(sequences, device=A.device)
    B, T = ids.shape
    eng = Engine(A, B, T, FullDepth(L), NaiveMask(), 1)
    cols = torch.arange(T)
    h0 = A.embed(ids)
    cos, sin = A.rope(h0, cols[None].expand(B, T).to(A.device))

    def forward(h, layers):
        """Inputs to each layer in ``layers`` order and the final hidden state."""
        ins = []
        for l in layers:
            ins.append(h)
            h = eng.layer(l, h, slice(None), cols, cos, sin, COMPUTED, audit=False)
        return ins, h

    def predict(h):
        return A.logits(h).argmax(-1)

    ins, top = forward(h0, range(L))
    target = predict(top)
    path = [{"n_skip": 0, "skip": (), "agreement": 1.0}]
    kept = list(range(L))
    steps = progress_bar(range(n_skip), show=progress, desc="choosing layers to skip", leave=False)
    for _ in steps:
        best = None
        for n in cand:
            l = n - 1
            if l not in kept:
                continue
            i = kept.index(l)
            above, h = forward(ins[i], kept[i + 1:])       # layer l left out: its input goes on upwards
            agree = float((predict(h) == target).float().mean())
            if best is None or agree > best[1]:
                best = (l, agree, above)
        l, agree, new_ins = best
        i = kept.index(l)
        kept.pop(i)
        ins = ins[:i] + new_ins                          # the layers above l now see l's input (kept above)
        path.append({"n_skip": len(path), "skip": tuple(sorted(set(range(1, L + 1)) - {m + 1 for m in kept})),
                     "agreement": agree})
    return path

"""The token loop: layer by layer, with our own attention over our own audited cache.

An :class:`Engine` holds a model (through its :class:`~earlyexit.engine.adapter.Adapter`), a
:class:`~earlyexit.engine.cache.KVCache`, an exit rule and a fill strategy. :func:`early_exit` runs greedy
decoding with them; callers use the front door, :func:`earlyexit.engine.decode`.

Conventions: layers are counted from 1 when we speak of an exit (``exit = n`` means the token ran
layers 1..n and read its prediction there; ``n = L`` is the full model) and indexed from 0 in code.
The prompt is always encoded at full depth. Generated token ``t`` is predicted by the step whose
input is token ``t − 1`` at cache column ``P + t − 1`` (``P`` = padded prompt length); token 0 comes
from the prompt's last position.
"""
from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from ..clock import now
from ..progress import bar
from .adapter import Adapter
from .cache import COMPUTED, HOLE, PAD, RECOMPUTED, KVCache
from .result import COUNTERS, Result, prompt_pass
from .fill import Strategy
from .rules import ExitRule, StepView


class Engine:
    """A Llama-family decoder run layer by layer over a :class:`KVCache`."""

    def __init__(self, A: Adapter, batch: int, max_len: int, rule: ExitRule, strategy: Strategy,
                 n_new: int, audit_weights: bool = False):
        self.A = A
        self.L, self.B = A.L, batch
        self.cache = KVCache(self.L, batch, A.Hkv, A.d, max_len, A.dtype, A.device)
        self.rule, self.strategy = rule, strategy
        self.n_new = n_new
        self.audit_weights = audit_weights
        self.counts = {c: torch.zeros(batch, n_new) for c in COUNTERS}
        # What ran, by kind and size, for the cost model: "layer:k" (one decoder layer over k tokens at once),
        # "head:<why>:r" (the head over r rows; why = decide, out, draft, verify, hindsight), "kv:r" (one
        # copy-forward K/V projection of r rows), "steps" (decoding steps). Kept apart for the prompt pass.
        self.calls = {"prefill": Counter(), "decode": Counter()}
        self.phase = "prefill"
        self.t = 0
        strategy.reset(self)

    def tally(self, what: str) -> None:
        self.calls[self.phase][what] += 1

    def head(self, h, why: str):
        """``head(norm(h))`` for h (b, S, D) or (b, D), counted as ``head:<why>:<rows>``."""
        self.tally(f"head:{why}:{h.shape[0] * (h.shape[1] if h.dim() == 3 else 1)}")
        return self.A.logits(h)

    # -- one decoder layer over the cache ------------------------------------------------------
    def layer(self, l: int, h, rows, cols, cos, sin, state, audit: bool = True, own: int | None = None):
        """Run decoder layer ``l`` on h (b, S, D) for ``rows`` at cache ``cols``; write K/V; return h.

        ``own``: how many of the b·S tokens are the step's own (the rest recompute earlier tokens' skipped
        entries); by default all of them, or none when ``state`` is RECOMPUTED. Tallied as ``layer:k`` or
        ``layer:k:r`` with r the recomputed ones."""
        A = self.A
        if isinstance(rows, torch.Tensor) and rows.numel() == self.B:
            rows = slice(None)      # every row (rows are distinct): views instead of gathers, same values
        k_all = h.shape[0] * h.shape[1]
        r = k_all - (own if own is not None else (0 if state is RECOMPUTED else k_all))
        self.tally(f"layer:{k_all}:{r}" if r else f"layer:{k_all}")
        q, k, v = A.qkv(l, h, cos, sin)
        self.cache.write(l, rows, cols, k, v, state)
        end = (cols if isinstance(cols, int) else int(cols.max())) + 1
        K, V = self.cache.k[l, rows, :, :end], self.cache.v[l, rows, :, :end]
        mask = self._mask(l, rows, cols, end, audit)
        scale = A.attn_scale(l)
        o = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=scale, enable_gqa=A.H != A.Hkv)
        if self.audit_weights and h.shape[1] == 1 and audit and self.cache.maybe_masked[l]:
            self._audit_weight(l, rows, q, K, mask, end, scale)
        return A.finish_layer(l, h, o)

    def _mask(self, l, rows, cols, end, audit):
        S = 1 if isinstance(cols, int) else len(cols)
        if S == 1 and not self.cache.maybe_masked[l]:
            return None
        st = self.cache.state[l, rows, :end]  # (b, end)
        if audit and S == 1:
            self.count(rows, "hole_reads", (st == HOLE).any(-1).float())
        valid = st != PAD
        if not self.strategy.reads_holes:
            valid &= st != HOLE
        if S == 1:
            return valid[:, None, None, :]
        col_t = torch.as_tensor(cols, device=st.device)
        keys = torch.arange(end, device=st.device)
        causal = keys[None, :] <= col_t[:, None]                           # (S, end)
        mask = valid[:, None, None, :] & causal[None, None]
        mask |= (keys[None, :] == col_t[:, None])[None, None]               # a query always sees itself
        return mask

    def _audit_weight(self, l, rows, q, K, mask, end, scale):
        """Softmax mass the current token puts on holes at layer l (a debugging probe, slow)."""
        Kr = K.repeat_interleave(self.A.H // self.A.Hkv, dim=1)
        w = torch.softmax(((q @ Kr.transpose(-1, -2)) * scale).masked_fill(
            ~mask if mask is not None else torch.zeros_like(q[..., :1, :1], dtype=torch.bool), float("-inf")),
            dim=-1)
        hole = (self.cache.state[l, rows, :end] == HOLE).float()[:, None, None, :]
        self.count(rows, "hole_weight", (w * hole).sum(-1).mean(dim=(1, 2)).float().cpu())

    def count(self, rows, name: str, value) -> None:
        if isinstance(value, torch.Tensor):
            value = value.to(self.counts[name].device)
        self.counts[name][rows, self.t] += value

    # -- running one layer for the current tokens, with the strategy's extra tokens batched in ------
    def run(self, l, h, rows, col, pos, cos, sin):
        extra = self.strategy.before_layer(self, l, rows)
        if not extra:
            return self.layer(l, h, rows, col, cos, sin, COMPUTED)
        out = torch.empty_like(h)
        plain = [i for i, r in enumerate(rows.tolist()) if r not in extra]
        if plain:
            idx = torch.tensor(plain)
            out[idx] = self.layer(l, h[idx], rows[idx], col, cos[idx], sin[idx], COMPUTED)
        for i, r in enumerate(rows.tolist()):
            if r not in extra:
                continue
            pcols, ph, ppos = extra[r]
            hh = torch.cat([ph, h[i:i + 1]], dim=1)
            pp = torch.cat([ppos, pos[i:i + 1]], dim=1)
            c2, s2 = self.A.rope(hh, pp)
            hn = self.layer(l, hh, torch.tensor([r]), torch.tensor(pcols + [col]), c2, s2, RECOMPUTED, own=1)
            self.cache.state[l, r, col] = COMPUTED
            self.strategy.after_layer(self, l, r, pcols, hn[:, :-1])
            self.counts["recompute_layers"][r, self.t] += len(pcols)
            out[i] = hn[0, -1:]
        return out

    # -- one generated token -----------------------------------------------------------------
    def step(self, tok, rows, col, pos):
        """Run the input tokens ``tok`` (b,) of ``rows`` at column ``col``; return (logits, exit layers)."""
        A, L, t, rule = self.A, self.L, self.t, self.rule
        h = A.embed(tok)[:, None, :]
        cos, sin = A.rope(h, pos)
        out_logits = torch.empty(len(rows), A.head.out_features, dtype=h.dtype, device=h.device)
        exits = torch.full((len(rows),), L, dtype=torch.long)
        where = torch.arange(len(rows))      # position of each still-running row in the outputs
        plan = list(rule.plan(t))
        kept = []                             # hindsight rules: every layer's output, decided afterwards
        for i, l in enumerate(plan):        # layers_run is counted once per row: i + 1 at its exit, else len(plan)
            h_new = self.run(l, h, rows, col, pos, cos, sin)
            n = l + 1
            if rule.hindsight:
                kept.append(h_new[:, -1])
            elif rule.checks_at(n, t):
                lg = None
                if rule.needs_logits:
                    lg = self.head(h_new[:, -1], "decide")
                    self.count(rows, "head_checks", 1)
                if not rule.needs_logits:
                    self.tally(f"check:{rule.name}:{len(rows)}")
                ex = rule.decide(StepView(n, t, self.n_new, h_new[:, -1], h[:, -1], lg))
                if bool(ex.any()):
                    er = rows[ex]
                    out_logits[where[ex]] = lg[ex] if lg is not None else self.head(h_new[ex][:, -1], "out")
                    if lg is None:
                        self.count(er, "head_checks", 1)
                    exits[where[ex]] = n
                    self.count(er, "layers_run", i + 1)
                    self.strategy.on_exit(self, er, n, h_new[ex], col, pos[ex])
                    keep = ~ex
                    rows, where, pos = rows[keep], where[keep], pos[keep]
                    h_new, cos, sin = h_new[keep], cos[keep], sin[keep]
                    if len(rows) == 0:
                        return out_logits, exits
            h = h_new
        for l in sorted(set(range(L)) - set(plan)):
            self.cache.maybe_masked[l] = True       # entries the plan left unwritten (never read: tested)
        self.count(rows, "layers_run", len(plan))
        if rule.hindsight:
            return self._decide_in_hindsight(kept, rows, col, pos)
        out_logits[where] = self.head(h[:, -1], "out")
        self.count(rows, "head_checks", 1)
        return out_logits, exits

    def _decide_in_hindsight(self, hs, rows, col, pos):
        """The whole stack ran; ask the rule at each checked layer from the bottom (with the top layer's
        prediction in hand), then rewind each row's cache above its exit and charge only its own layers."""
        L, rule = self.L, self.rule
        lg = self.head(torch.stack(hs, dim=1), "hindsight")    # (b, L, V): one head pass for all layers
        final = lg[:, -1].argmax(-1)
        exits = torch.full((len(rows),), L, dtype=torch.long, device=lg.device)
        open_ = torch.ones(len(rows), dtype=torch.bool, device=lg.device)
        for n in range(1, L):
            if not rule.checks_at(n, self.t):
                continue
            ex = rule.decide(StepView(n, self.t, self.n_new, hs[n - 1], hs[n - 2] if n > 1 else hs[0],
                                      lg[:, n - 1], final)) & open_
            exits[ex] = n
            open_ &= ~ex
        self.counts["layers_run"][rows, self.t] = exits.float().to(self.counts["layers_run"].device)
        self.count(rows, "head_checks", 1)
        for n in sorted(set(exits.tolist())):
            if n == L:
                continue
            sel = exits == n
            er = rows[sel]
            self.cache.leave_hole(range(n, L), er, col)
            self.strategy.on_exit(self, er, n, hs[n - 1][sel][:, None, :], col, pos[sel])
        out = lg[torch.arange(len(rows)), exits - 1]
        return out, exits.cpu()


@torch.inference_mode()
def early_exit(A: Adapter, prompts: list[list[int]], max_new_tokens: int, rule: ExitRule, strategy: Strategy,
               config, *, pad_id: int, eos_set: set, force=None, return_logits: bool = False,
               return_kv: bool = False, flush: bool = False, progress: bool = False,
               audit_weights: bool = False) -> Result:
    """Greedy decoding of ``prompts`` (checked token-id lists) with an exit rule and a fill strategy; ``config`` is
    the :class:`~earlyexit.engine.config.EarlyExit` that asked for them (its label, kept in the Result).

    ``force`` (B, N) replaces the fed-back token by the given one (teacher forcing), so that
    ``logits`` scores a reference under the cache the method builds. ``flush`` does the strategy's
    deferred work after the last step (not timed), so that ``kv`` is the cache it would end with.
    """
    dev = A.device
    B = len(prompts)
    P = max(len(p) for p in prompts)
    N = max_new_tokens
    L = A.L
    eng = Engine(A, B, P + N, rule, strategy, N, audit_weights=audit_weights)
    pad = torch.tensor([P - len(p) for p in prompts])
    ids = torch.full((B, P), pad_id, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, P - len(p):] = torch.tensor(p)
    ids = ids.to(dev)
    pos_all = (torch.arange(P + N)[None, :] - pad[:, None]).clamp(min=0).to(dev)    # (B, C)

    t0 = now(dev)
    # Prefill at full depth; pad columns are marked PAD so no one attends to them.
    pstate = torch.full((B, P), COMPUTED, dtype=torch.uint8, device=dev)
    for b in range(B):
        pstate[b, : int(pad[b])] = PAD
    if bool(pad.any()):
        eng.cache.maybe_masked = [True] * L
    h = A.embed(ids)
    cos, sin = A.rope(h, pos_all[:, :P])
    cols = torch.arange(P)
    for l in range(L):
        h = eng.layer(l, h, slice(None), cols, cos, sin, pstate, audit=False)
    logits = eng.head(h[:, -1], "out")
    prefill_s = now(dev) - t0
    eng.phase = "decode"

    tokens = torch.full((B, N), pad_id, dtype=torch.long)
    exit_layer = torch.zeros((B, N), dtype=torch.long)
    col_exit = torch.full((B, P + N), L, dtype=torch.long)
    all_logits = torch.zeros((B, N, logits.shape[-1]), dtype=torch.float32) if return_logits else None
    n_new = torch.zeros(B, dtype=torch.long)
    exit_layer[:, 0] = L
    prompt_pass(eng.counts, L)
    rows = torch.arange(B)
    step_s, last = [], now(dev)     # each step's wall seconds: timing.step_floor takes their minimum over rounds
    it = bar(range(N), show=progress, desc=config.label, leave=False)
    for t in it:
        eng.t = t
        if t > 0:
            col = P + t - 1
            inp = force[rows, t - 1] if force is not None else tokens[rows, t - 1]
            eng.tally("steps")
            step_logits, ex = eng.step(inp.to(dev), rows, col, pos_all[rows, col:col + 1])
            logits = torch.empty((B, step_logits.shape[-1]), dtype=step_logits.dtype, device=dev)
            logits[rows] = step_logits
            exit_layer[rows, t] = ex
            col_exit[rows, col] = ex
        pred = logits[rows].argmax(-1).cpu()
        tokens[rows, t] = pred
        if return_logits:
            all_logits[rows, t] = logits[rows].float().cpu()
        n_new[rows] = t + 1
        if eos_set:
            done = torch.tensor([int(x) in eos_set for x in pred.tolist()], dtype=torch.bool)
            rows = rows[~done]
        tn = now(dev)
        step_s.append(tn - last)
        last = tn
        if len(rows) == 0:
            break
    wall = now(dev) - t0
    col_exit[:, P + N - 1:] = 0   # the last prediction is never fed back
    for b in range(B):
        col_exit[b, P + int(n_new[b]) - 1:] = 0
        col_exit[b, : int(pad[b])] = 0
    calls = {ph: dict(sorted(c.items())) for ph, c in eng.calls.items()}
    state = eng.cache.state.cpu()
    pending = torch.tensor([strategy.pending(b) for b in range(B)])
    flushed = None
    if flush:
        strategy.flush(eng)
        flushed = eng.cache.state.cpu()
    kv = (eng.cache.k.cpu(), eng.cache.v.cpu()) if return_kv else None
    return Result(config=config, tokens=tokens, n_new=n_new, exit_layer=exit_layer, counts=eng.counts,
                  state=state, col_exit=col_exit, prompt_len=P, pad=pad, num_layers=L, wall_s=wall,
                  logits=all_logits, kv=kv, pending=pending, flushed_state=flushed,
                  cache_bytes=eng.cache.nbytes, meta={"rule": rule.name, "strategy": strategy.name, "calls": calls,
                        "prefill_s": prefill_s, "step_s": step_s})

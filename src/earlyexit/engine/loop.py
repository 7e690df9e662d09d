"""The token loop: layer by layer, with our own attention over our own audited cache.

One :class:`Engine` holds a model's pieces (embeddings, decoder layers, rotary embedding, final norm,
shared head), a :class:`~earlyexit.cache.KVCache`, an exit rule and a fill strategy. :func:`generate`
runs greedy decoding with it and returns a :class:`Trace`: the tokens, the exit layer of every
token, what every step cost (own layers, recompute work, copied K/V, head evaluations), the cache's
provenance map and the wall time.

Conventions: layers are counted from 1 when we speak of an exit (``exit = n`` means the token ran
layers 1..n and read its prediction there; ``n = L`` is the full model) and indexed from 0 in code.
The prompt is always encoded at full depth. Generated token ``t`` is predicted by the step whose
input is token ``t − 1`` at cache column ``P + t − 1`` (``P`` = padded prompt length); token 0 comes
from the prompt's last position.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .cache import COMPUTED, HOLE, PAD, RECOMPUTED, KVCache
from .rules import ExitRule, Oracle, SkipDecode, make_rule
from .fill import LazyRecompute, Strategy, make_strategy

COUNTERS = ("layers_run", "recompute_layers", "copied_kv", "head_checks", "hole_reads", "hole_weight")


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@dataclass
class Trace:
    """Everything one call of :func:`generate` did, per sequence ``b`` and generated token ``t``."""

    tokens: torch.Tensor          # (B, N) greedy predictions (pad_id after EOS)
    n_new: torch.Tensor           # (B,) tokens generated before stopping (EOS included)
    exit_layer: torch.Tensor      # (B, N) layers the predicting step ran to (L = full depth)
    counts: dict                  # name -> (B, N) float tensor, see COUNTERS
    state: torch.Tensor           # (L, B, C) provenance map of the cache after the run
    col_exit: torch.Tensor        # (B, C) exit layer of the token at each column (L for the prompt)
    prompt_len: int               # P: padded prompt length (first generated column)
    pad: torch.Tensor             # (B,) left padding of each row
    num_layers: int
    wall_s: float
    logits: torch.Tensor | None = None   # (B, N, V) if asked for
    meta: dict = field(default_factory=dict)

    def sequences(self) -> list[list[int]]:
        """Generated tokens of each row, up to and including EOS."""
        return [self.tokens[b, : int(self.n_new[b])].tolist() for b in range(self.tokens.shape[0])]

    def valid(self) -> torch.Tensor:
        """(B, N) bool: which (b, t) were generated."""
        N = self.tokens.shape[1]
        return torch.arange(N)[None, :] < self.n_new[:, None]

    def mean_layers(self) -> float:
        """Average decoder-layer evaluations per generated token, recompute included."""
        v = self.valid()
        tot = self.counts["layers_run"] + self.counts["recompute_layers"]
        return float(tot[v].mean())


class Engine:
    """A Llama-family decoder run layer by layer over a :class:`KVCache`."""

    def __init__(self, lm, batch: int, max_len: int, rule: ExitRule, strategy: Strategy,
                 n_new: int, audit_weights: bool = False):
        model = lm.model if hasattr(lm, "model") and hasattr(lm, "tokenizer") else lm
        inner = model.model
        cfg = model.config
        self.embed, self.layers, self.norm = inner.embed_tokens, inner.layers, inner.norm
        self.head, self.rotary = model.lm_head, inner.rotary_emb
        self.L, self.B = cfg.num_hidden_layers, batch
        self.H = cfg.num_attention_heads
        self.Hkv = getattr(cfg, "num_key_value_heads", None) or self.H
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.H
        p = next(model.parameters())
        self.cache = KVCache(self.L, batch, self.Hkv, self.d, max_len, p.dtype, p.device)
        self.rule, self.strategy = rule, strategy
        self.n_new = n_new
        self.audit_weights = audit_weights
        self.counts = {c: torch.zeros(batch, n_new) for c in COUNTERS}
        self.t = 0
        strategy.reset(self)

    # -- the pieces of one decoder layer ------------------------------------------------------
    def rope(self, h, pos):
        return self.rotary(h, pos)

    def kv_projection(self, j: int, h, cos, sin):
        """Layer j's K and V for hidden states h (b, S, D): its own input norm, W_K, W_V and RoPE."""
        layer = self.layers[j]
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        b, S, _ = h.shape
        k = attn.k_proj(x).view(b, S, self.Hkv, self.d).transpose(1, 2)
        v = attn.v_proj(x).view(b, S, self.Hkv, self.d).transpose(1, 2)
        if hasattr(attn, "k_norm"):
            k = attn.k_norm(k)
        k = k * cos.unsqueeze(1) + _rotate_half(k) * sin.unsqueeze(1)
        return k, v

    def layer(self, l: int, h, rows, cols, cos, sin, state, audit: bool = True):
        """Run decoder layer ``l`` on h (b, S, D) for ``rows`` at cache ``cols``; write K/V; return h."""
        layer = self.layers[l]
        attn = layer.self_attn
        b, S, _ = h.shape
        x = layer.input_layernorm(h)
        q = attn.q_proj(x).view(b, S, self.H, self.d).transpose(1, 2)
        k = attn.k_proj(x).view(b, S, self.Hkv, self.d).transpose(1, 2)
        v = attn.v_proj(x).view(b, S, self.Hkv, self.d).transpose(1, 2)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * c + _rotate_half(q) * s
        k = k * c + _rotate_half(k) * s
        self.cache.write(l, rows, cols, k, v, state)
        end = (cols if isinstance(cols, int) else int(cols.max())) + 1
        K, V = self.cache.k[l, rows, :, :end], self.cache.v[l, rows, :, :end]
        mask = self._mask(l, rows, cols, end, audit)
        o = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=attn.scaling,
                                           enable_gqa=self.H != self.Hkv)
        if self.audit_weights and S == 1 and audit and self.cache.maybe_masked[l]:
            self._audit_weight(l, rows, q, K, mask, end, attn.scaling)
        h = h + attn.o_proj(o.transpose(1, 2).reshape(b, S, self.H * self.d))
        return h + layer.mlp(layer.post_attention_layernorm(h))

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
        Kr = K.repeat_interleave(self.H // self.Hkv, dim=1)
        w = torch.softmax(((q @ Kr.transpose(-1, -2)) * scale).masked_fill(
            ~mask if mask is not None else torch.zeros_like(q[..., :1, :1], dtype=torch.bool), float("-inf")),
            dim=-1)
        hole = (self.cache.state[l, rows, :end] == HOLE).float()[:, None, None, :]
        self.count(rows, "hole_weight", (w * hole).sum(-1).mean(dim=(1, 2)).float().cpu())

    def logits(self, h):
        return self.head(self.norm(h))

    def count(self, rows, name: str, value) -> None:
        if isinstance(value, torch.Tensor):
            value = value.to(self.counts[name].device)
        self.counts[name][rows, self.t] += value

    # -- running one layer for the current tokens, with lazy recompute batched in ---------------
    def run(self, l, h, rows, col, pos, cos, sin):
        extra = self.strategy.before_layer(self, l, rows)
        self.count(rows, "layers_run", 1)
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
            c2, s2 = self.rope(hh, pp)
            hn = self.layer(l, hh, torch.tensor([r]), torch.tensor(pcols + [col]), c2, s2, RECOMPUTED)
            self.cache.state[l, r, col] = COMPUTED
            self.strategy.after_layer(self, l, r, pcols, hn[:, :-1])
            self.counts["recompute_layers"][r, self.t] += len(pcols)
            out[i] = hn[0, -1:]
        return out

    # -- one generated token -----------------------------------------------------------------
    def step(self, tok, rows, col, pos):
        """Run the input tokens ``tok`` (b,) of ``rows`` at column ``col``; return (logits, exit)."""
        L, t = self.L, self.t
        h = self.embed(tok)[:, None, :]
        cos, sin = self.rope(h, pos)
        out_logits = torch.empty(len(rows), self.head.out_features, dtype=h.dtype, device=h.device)
        exits = torch.full((len(rows),), L, dtype=torch.long)
        rule = self.rule
        if isinstance(rule, SkipDecode):
            plan = rule.layers(t)
            for l in plan:
                h = self.run(l, h, rows, col, pos, cos, sin)
            for l in sorted(set(range(L)) - set(plan)):
                self.cache.maybe_masked[l] = True       # unwritten entries exist (never read: tested)
            self.count(rows, "head_checks", 1)
            return self.logits(h)[:, -1], exits
        if isinstance(rule, Oracle):
            return self._oracle_step(h, rows, col, pos, cos, sin)
        where = torch.arange(len(rows))      # position of each still-running row in the outputs
        h_prev = h
        for l in range(L):
            h_new = self.run(l, h, rows, col, pos, cos, sin)
            n = l + 1
            if rule.checks_at(n, t):
                lg = None
                if rule.needs_logits:
                    lg = self.logits(h_new)[:, -1]
                    self.count(rows, "head_checks", 1)
                ex = rule.decide(n, t, self.n_new, h_new[:, -1], h[:, -1], lg)
                if bool(ex.any()):
                    er = rows[ex]
                    out_logits[where[ex]] = lg[ex] if lg is not None else self.logits(h_new[ex])[:, -1]
                    if lg is None:
                        self.count(er, "head_checks", 1)
                    exits[where[ex]] = n
                    self.strategy.on_exit(self, er, n, h_new[ex], col, pos[ex])
                    keep = ~ex
                    rows, where, pos = rows[keep], where[keep], pos[keep]
                    h_new, cos, sin = h_new[keep], cos[keep], sin[keep]
                    if len(rows) == 0:
                        return out_logits, exits
            h = h_new
        out_logits[where] = self.logits(h)[:, -1]
        self.count(rows, "head_checks", 1)
        return out_logits, exits

    def _oracle_step(self, h, rows, col, pos, cos, sin):
        """Run the whole stack, then exit each row at the first layer whose argmax equals the top's."""
        L = self.L
        hs = []
        for l in range(L):
            h = self.run(l, h, rows, col, pos, cos, sin)
            hs.append(h[:, -1])
        lg = self.logits(torch.stack(hs, dim=1))            # (b, L, V)
        am = lg.argmax(-1)
        agree = am == am[:, -1:]
        agree[:, : self.rule.min_layer - 1] = False
        exits = agree.float().argmax(-1) + 1                 # first agreeing layer, 1-based
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


def _as_rule(rule, L, rule_kw):
    if isinstance(rule, ExitRule):
        if rule.num_layers != L:
            raise ValueError(f"exit rule was built for {rule.num_layers} layers, the model has {L}")
        return rule
    if not isinstance(rule, str):
        raise ValueError(f"rule must be a rule name or an ExitRule, got {type(rule).__name__}")
    return make_rule(rule, L, **(rule_kw or {}))


@torch.inference_mode()
def generate(lm, prompts, max_new_tokens: int, rule="full", strategy="naive-mask", *, rule_kw=None,
             stop_at_eos: bool = True, force=None, return_logits: bool = False, progress: bool = False,
             audit_weights: bool = False) -> Trace:
    """Greedy decoding of ``prompts`` (a list of token-id lists) with an exit rule and a fill strategy.

    ``force`` (B, N) replaces the fed-back token by the given one (teacher forcing), so that
    ``trace.logits`` scores a reference under the cache the method builds.
    Every argument is checked before any compute; errors name the valid range or options.
    """
    model = lm.model if hasattr(lm, "tokenizer") else lm
    cfg = model.config
    L = cfg.num_hidden_layers
    if isinstance(prompts, torch.Tensor):
        prompts = prompts.tolist()
    if prompts and isinstance(prompts[0], int):
        prompts = [prompts]
    if not prompts or any(not p for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    if any(not all(isinstance(i, int) and 0 <= i < cfg.vocab_size for i in p) for p in prompts):
        raise ValueError(f"prompt token ids must be ints in [0, {cfg.vocab_size})")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    rule = _as_rule(rule, L, rule_kw)
    strat = make_strategy(strategy) if isinstance(strategy, str) else strategy
    B = len(prompts)
    P = max(len(p) for p in prompts)
    limit = cfg.max_position_embeddings
    sw = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
    if sw:
        limit = min(limit, sw)
    if P + max_new_tokens > limit:
        raise ValueError(f"prompt ({P} tokens) + max_new_tokens ({max_new_tokens}) = {P + max_new_tokens} "
                         f"exceeds the model's context of {limit} tokens; valid: at most {limit} in total")
    if force is not None:
        force = torch.as_tensor(force, dtype=torch.long)
        if force.dim() == 1:
            force = force[None]
        if force.shape != (B, max_new_tokens):
            raise ValueError(f"force must have shape (B, max_new_tokens) = {(B, max_new_tokens)}, "
                             f"got {tuple(force.shape)}")

    dev = next(model.parameters()).device
    pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else 0
    eos = cfg.eos_token_id if stop_at_eos else None
    eos_set = set(eos if isinstance(eos, (list, tuple)) else [eos]) if eos is not None else set()
    N = max_new_tokens
    eng = Engine(model, B, P + N, rule, strat, N, audit_weights=audit_weights)
    pad = torch.tensor([P - len(p) for p in prompts])
    ids = torch.full((B, P), pad_id, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, P - len(p):] = torch.tensor(p)
    ids = ids.to(dev)
    pos_all = (torch.arange(P + N)[None, :] - pad[:, None]).clamp(min=0).to(dev)    # (B, C)

    t0 = time.perf_counter()
    # Prefill at full depth; pad columns are marked PAD so no one attends to them.
    pstate = torch.full((B, P), COMPUTED, dtype=torch.uint8, device=dev)
    for b in range(B):
        pstate[b, : int(pad[b])] = PAD
    if bool(pad.any()):
        eng.cache.maybe_masked = [True] * L
    h = eng.embed(ids)
    cos, sin = eng.rope(h, pos_all[:, :P])
    cols = torch.arange(P)
    for l in range(L):
        h = eng.layer(l, h, slice(None), cols, cos, sin, pstate, audit=False)
    logits = eng.logits(h[:, -1])

    tokens = torch.full((B, N), pad_id, dtype=torch.long)
    exit_layer = torch.zeros((B, N), dtype=torch.long)
    col_exit = torch.full((B, P + N), L, dtype=torch.long)
    all_logits = torch.zeros((B, N, logits.shape[-1]), dtype=torch.float32) if return_logits else None
    n_new = torch.zeros(B, dtype=torch.long)
    exit_layer[:, 0] = L
    eng.counts["layers_run"][:, 0] = L
    eng.counts["head_checks"][:, 0] = 1
    rows = torch.arange(B)
    it = tqdm(range(N), desc=f"{rule.name}/{strat.name}", disable=not progress, leave=False)
    for t in it:
        eng.t = t
        if t > 0:
            col = P + t - 1
            inp = force[rows, t - 1] if force is not None else tokens[rows, t - 1]
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
            if len(rows) == 0:
                break
    wall = time.perf_counter() - t0
    col_exit[:, P + N - 1:] = 0   # the last prediction is never fed back
    for b in range(B):
        col_exit[b, P + int(n_new[b]) - 1:] = 0
        col_exit[b, : int(pad[b])] = 0
    return Trace(tokens=tokens, n_new=n_new, exit_layer=exit_layer, counts=eng.counts,
                 state=eng.cache.state.cpu(), col_exit=col_exit, prompt_len=P, pad=pad, num_layers=L,
                 wall_s=wall, logits=all_logits,
                 meta={"rule": rule.name, "strategy": strat.name, "cache_bytes": eng.cache.nbytes,
                       "engine": eng})

"""What a decoding run did: :class:`Result`, its counters (:data:`COUNTERS`), and the prompt pass's share of them;
for methods that decode prompts one after another, what one prompt did (:class:`Row`) and how the rows make one
Result (:func:`one_by_one`)."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import torch

from .cache import PAD

# Counters every Result carries, per row and generated token (B, N); see Result.
COUNTERS = ("layers_run", "recompute_layers", "copied_kv", "head_checks", "hole_reads", "hole_weight",
            "drafted", "accepted")


def prompt_pass(counts: dict, L: int) -> None:
    """The prompt pass's counters, the same for every method and set only here: it runs all ``L`` layers and
    the head once, and predicts token 0 (column 0 of each (B, N) counter)."""
    counts["layers_run"][:, 0] = L
    counts["head_checks"][:, 0] = 1


@dataclass
class Result:
    """Everything one decoding run did, per row ``b`` (prompt) and generated token ``t``.

    ``counts[name]`` is a (B, N) float tensor for each of :data:`COUNTERS`: decoder layers the token's own
    step ran (``layers_run``), layers run to recompute earlier tokens' skipped entries
    (``recompute_layers``), K/V pairs copied forward (``copied_kv``), head evaluations (``head_checks``),
    whether the step attended into a hole (``hole_reads``) and the softmax mass it put there
    (``hole_weight``, only with ``audit_weights``), drafts made and accepted (self-speculation: the round's
    counts sit at the first token the round emitted, and so do its layers and heads).
    """

    config: object                # the method's configuration (earlyexit.engine.config.DecodeConfig)
    tokens: torch.Tensor          # (B, N) greedy predictions (pad_id after EOS)
    n_new: torch.Tensor           # (B,) tokens generated before stopping (EOS included)
    exit_layer: torch.Tensor      # (B, N) layers the predicting step ran to (L = full depth)
    counts: dict                  # name -> (B, N) float tensor, see COUNTERS
    state: torch.Tensor | None    # (L, B, C) provenance map of the cache after the run
    col_exit: torch.Tensor | None  # (B, C) exit layer of the token at each column (L for the prompt)
    prompt_len: int               # P: padded prompt length (first generated column)
    pad: torch.Tensor             # (B,) left padding of each row
    num_layers: int
    wall_s: float
    logits: torch.Tensor | None = None   # (B, N, V) if asked for
    kv: tuple | None = None              # (K, V), each (L, B, H_kv, C, d), if asked for
    pending: torch.Tensor | None = None  # (B,) cache entries still owed by deferred recompute at the end
    flushed_state: torch.Tensor | None = None  # (L, B, C) after the deferred work was done (flush=True)
    rounds: torch.Tensor | None = None   # (B,) self-speculation rounds
    cache_bytes: int = 0
    meta: dict = field(default_factory=dict)

    def sequences(self) -> list[list[int]]:
        """Generated tokens of each row, up to and including EOS."""
        return [self.tokens[b, : int(self.n_new[b])].tolist() for b in range(self.tokens.shape[0])]

    def valid(self) -> torch.Tensor:
        """(B, N) bool: which (b, t) were generated."""
        N = self.tokens.shape[1]
        return torch.arange(N)[None, :] < self.n_new[:, None]

    def steps(self) -> torch.Tensor:
        """(B, N) bool: the decoding steps, i.e. generated tokens after the first (which the prompt pass
        predicts at full depth for every method)."""
        s = self.valid().clone()
        s[:, 0] = False
        return s

    def per_step(self, name: str) -> torch.Tensor:
        """(B,) mean of counter ``name`` over each row's decoding steps."""
        s = self.steps()
        c = self.counts[name].float()
        return (c * s).sum(1) / s.sum(1).clamp(min=1)

    def mean_layers(self) -> float:
        """Average decoder-layer evaluations per generated token, recompute included."""
        v = self.valid()
        tot = self.counts["layers_run"] + self.counts["recompute_layers"]
        return float(tot[v].mean())

    @property
    def acceptance(self) -> float:
        """Accepted / drafted tokens over the whole run (self-speculation; NaN otherwise)."""
        d = float(self.counts["drafted"].sum())
        return float(self.counts["accepted"].sum()) / d if d else float("nan")


def calls_json(calls: dict) -> str:
    """A Result's calls (``meta["calls"]``, or one phase of them) as one JSON string, for a table column."""
    return json.dumps(calls, sort_keys=True, separators=(",", ":"))


@dataclass
class Row:
    """What decoding one prompt did (methods that decode prompts one after another). ``counts``: name -> (n,)
    values per generated token for the counters the method knows (the others are NaN in the Result, since the
    method cannot know them); the prompt pass (token 0) is set by the caller, for every method alike."""

    tokens: list
    wall_s: float
    counts: dict = field(default_factory=dict)
    prefill_s: float = float("nan")         # the prompt pass's share of wall_s, where the method can tell
    rounds: int | None = None
    calls: dict = field(default_factory=dict)
    state: torch.Tensor | None = None       # (L, C) provenance map of the row's cache, where there is one
    step_s: list | None = None              # wall seconds of each decoding step or round, where the method can tell


def one_by_one(config, A, lm, prompts: list[list[int]], N: int, *, pad_id: int, eos_set: set, stop_at_eos: bool,
               progress: bool = False) -> Result:
    """Decode ``prompts`` one after another with ``config.decode_row`` and gather one :class:`Result` (the
    per-prompt times in ``meta["wall_s_rows"]``). A counter the method does not report is NaN for its
    generated tokens after the first, never 0: a peer's layers per token are its own business."""
    L, B, P = A.L, len(prompts), max(len(p) for p in prompts)
    tokens = torch.full((B, N), pad_id, dtype=torch.long)
    counts = {c: torch.full((B, N), float("nan")) for c in COUNTERS}
    n_new = torch.zeros(B, dtype=torch.long)
    rounds = torch.zeros(B, dtype=torch.long)
    has_rounds = False
    walls, prefills, steps = [], [], []
    calls = {"prefill": Counter(), "decode": Counter()}
    state = None
    for b, p in enumerate(prompts):
        row = config.decode_row(A, lm, p, N, eos_set=eos_set, stop_at_eos=stop_at_eos, progress=progress)
        n = len(row.tokens)
        tokens[b, :n] = torch.tensor(row.tokens, dtype=torch.long)
        for c in COUNTERS:
            counts[c][b, n:] = 0                   # nothing generated there: no work, nothing unknown
            if c in row.counts:
                counts[c][b, :n] = row.counts[c][:n]
        n_new[b] = n
        walls.append(row.wall_s)
        prefills.append(row.prefill_s)
        steps = None if steps is None or row.step_s is None else steps + list(row.step_s)
        if row.rounds is not None:
            rounds[b], has_rounds = row.rounds, True
        for ph, c in row.calls.items():
            calls[ph].update(c)
        if row.state is not None:
            if state is None:
                state = torch.full((L, B, P + N + config.extra_columns), PAD, dtype=torch.uint8)
            state[:, b, P - len(p):] = row.state           # a row's cache is len(p) + N + extra long
    prompt_pass(counts, L)
    pad = torch.tensor([P - len(p) for p in prompts])
    return Result(config=config, tokens=tokens, n_new=n_new, exit_layer=torch.full((B, N), L, dtype=torch.long),
                  counts=counts, state=state, col_exit=None, prompt_len=P, pad=pad, num_layers=L,
                  wall_s=float(sum(walls)), rounds=rounds if has_rounds else None,
                  meta={"wall_s_rows": walls, "prefill_s_rows": prefills, "prefill_s": float(sum(prefills)),
                        **({"step_s": steps} if steps is not None else {}),
                        "calls": {ph: dict(sorted(c.items())) for ph, c in calls.items()}})

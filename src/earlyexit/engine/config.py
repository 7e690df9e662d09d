"""What to decode with (:class:`DecodeConfig`) and what a decoding run did (:class:`Result`).

    cfg = DecodeConfig.early_exit("softmax", "lazy-recompute", threshold=0.9, min_layer=15)
    cfg = DecodeConfig.self_speculation(exit_layer=25, draft_len=2)
    cfg = DecodeConfig.hf_assistant(exit_layer=25, draft_len=2)     # transformers' own, as a peer
    cfg = DecodeConfig.hf_generate()                                 # transformers' plain greedy generate
    cfg.label     # 'softmax 0.9 / lazy-recompute'
    cfg.key()     # plain data for a result-cache key

A configuration is frozen plain data: it hashes, prints and compares by value, and it never holds a model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .fill import STRATEGIES
from .rules import RULES

METHODS = ("early-exit", "self-speculation", "hf-assistant", "economize", "hf-generate")
# Counters every Result carries, per row and generated token (B, N); see Result.
COUNTERS = ("layers_run", "recompute_layers", "copied_kv", "head_checks", "hole_reads", "hole_weight",
            "drafted", "accepted")


def _freeze(v):
    return tuple(_freeze(x) for x in v) if isinstance(v, (list, tuple)) else v


def _plain(v):
    return [_plain(x) for x in v] if isinstance(v, tuple) else v


@dataclass(frozen=True)
class DecodeConfig:
    """One decoding method with its arguments.

    ``method`` is ``"early-exit"`` (an exit rule with a fill strategy), ``"self-speculation"`` (LayerSkip:
    draft with the first ``exit_layer`` layers, ``draft_len`` tokens a round, verify with the rest over one
    cache), ``"hf-assistant"`` (transformers' ``generate(assistant_early_exit=...)``, the same idea, as a
    peer), ``"economize"`` (the economize library's drafters, a second peer: :mod:`earlyexit.engine.peers`) or
    ``"hf-generate"`` (transformers' plain greedy ``generate``: the peer of this engine's full depth).
    ``rule_args`` holds the rule's arguments as sorted (name, value) pairs; build configurations with the class
    methods, which take them as keywords.
    """

    method: str = "early-exit"
    rule: str = "full"
    strategy: str = "naive-mask"
    rule_args: tuple = ()
    exit_layer: int | None = None
    draft_len: int | None = None

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown decoding method {self.method!r}; valid: {', '.join(METHODS)}")
        if self.method == "early-exit":
            if self.rule not in RULES:
                raise ValueError(f"unknown exit rule {self.rule!r}; valid: {', '.join(RULES)}")
            if self.strategy not in STRATEGIES:
                raise ValueError(f"unknown fill strategy {self.strategy!r}; valid: {', '.join(STRATEGIES)}")
        elif self.method == "hf-generate":
            if self.rule_args or self.exit_layer is not None or self.draft_len is not None:
                raise ValueError("hf-generate is transformers' plain greedy decoding: it takes no exit layer, draft "
                                 "length or options")
        else:
            for name in ("exit_layer", "draft_len"):
                v = getattr(self, name)
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    raise ValueError(f"{self.method} needs {name} as an int >= 1, got {v!r}")
            _check_draft_args(self.method, dict(self.rule_args))
        args = dict(self.rule_args)
        object.__setattr__(self, "rule_args", tuple(sorted((k, _freeze(v)) for k, v in args.items())))

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def early_exit(cls, rule: str = "full", strategy: str = "naive-mask", **rule_args) -> "DecodeConfig":
        return cls("early-exit", rule, strategy, tuple(rule_args.items()))

    @classmethod
    def full(cls) -> "DecodeConfig":
        return cls.early_exit("full")

    @classmethod
    def self_speculation(cls, exit_layer: int, draft_len: int, **draft_args) -> "DecodeConfig":
        """LayerSkip's drafting from layer ``exit_layer``, ``draft_len`` tokens a round. ``shortlist=K`` drafts
        over the K tokens most frequent in the training stream (FR-Spec; verification keeps the full head, so
        the output is unchanged); ``confidence=c`` stops a round's drafting early once a draft's probability
        (over the shortlist, if any) falls below c, so ``draft_len`` becomes the longest draft;
        ``skip=(n, ...)`` leaves those layers (numbered 1..L) out of the draft as well (a layer-skipping draft,
        Draft & Verify / SWIFT: with ``exit_layer = L`` the draft is the whole model minus the skipped layers,
        read through the full head, and needs no training)."""
        return cls("self-speculation", "full", "naive-mask", tuple(draft_args.items()), exit_layer, draft_len)

    @classmethod
    def hf_assistant(cls, exit_layer: int, draft_len: int) -> "DecodeConfig":
        return cls("hf-assistant", "full", "naive-mask", (), exit_layer, draft_len)

    @classmethod
    def hf_generate(cls) -> "DecodeConfig":
        """transformers' own greedy ``generate`` at full depth, as the peer of this engine's full depth."""
        return cls("hf-generate")

    @classmethod
    def economize(cls, exit_layer: int, draft_len: int, **draft_args) -> "DecodeConfig":
        """The economize library's speculative decoding as a peer: its ``early_exit`` drafter from layer
        ``exit_layer``, or with ``skip=(n, ...)`` its ``layer_skip`` drafter leaving those layers out (give
        ``exit_layer = L``); ``shortlist=K`` wraps the drafter in its ``frspec`` over the same K token ids
        ours drafts over."""
        return cls("economize", "full", "naive-mask", tuple(draft_args.items()), exit_layer, draft_len)

    def replace(self, **changes) -> "DecodeConfig":
        """A copy with ``changes``; rule arguments by name (``cfg.replace(threshold=0.99)``)."""
        own = {k: changes.pop(k) for k in ("method", "rule", "strategy", "exit_layer", "draft_len") if k in changes}
        args = {**self.args, **changes}
        return DecodeConfig(own.get("method", self.method), own.get("rule", self.rule),
                            own.get("strategy", self.strategy), tuple(args.items()),
                            own.get("exit_layer", self.exit_layer), own.get("draft_len", self.draft_len))

    # -- reading ---------------------------------------------------------------------------------
    @property
    def args(self) -> dict:
        """The rule's arguments as a dict (tuples where the rule takes a sequence)."""
        return dict(self.rule_args)

    @property
    def threshold(self) -> float:
        return float(self.args.get("threshold", float("nan")))

    @property
    def label(self) -> str:
        """A short human label: 'softmax 0.9 / copy-forward', 'static@20', 'self-spec E=25 d=2', ..."""
        if self.method == "self-speculation":
            kw = self.args
            extra = "".join(f" {n}={kw[k]:g}" for k, n in (("shortlist", "K"), ("confidence", "c")) if kw.get(k))
            if kw.get("skip"):
                extra += f" skip {len(kw['skip'])} layers"
            return f"self-spec E={self.exit_layer} d={self.draft_len}{extra}"
        if self.method == "hf-assistant":
            return f"hf assistant E={self.exit_layer} d={self.draft_len}"
        if self.method == "hf-generate":
            return "hf generate (full depth)"
        if self.method == "economize":
            kw = self.args
            what = f"layer_skip {len(kw['skip'])} layers" if kw.get("skip") else f"early_exit E={self.exit_layer}"
            return f"economize {what} d={self.draft_len}" + (f" K={kw['shortlist']}" if kw.get("shortlist") else "")
        kw = self.args
        if self.rule == "static":
            return f"static@{kw.get('layer')}"
        if self.rule == "skipdecode":
            return f"skipdecode {kw.get('e_max')}->{kw.get('e_min')}"
        if "threshold" in kw:
            return f"{self.rule} {kw['threshold']:g} / {self.strategy}"
        return f"{self.rule} / {self.strategy}"

    def key(self) -> dict:
        """Plain data that identifies the configuration (for a result-cache key)."""
        if self.method == "early-exit":
            return {"rule": self.rule, "strategy": self.strategy,
                    "rule_kw": {k: _plain(v) for k, v in self.rule_args}}
        if self.method == "hf-generate":
            return {"method": self.method}
        key = {"method": self.method, "E": self.exit_layer, "d": self.draft_len}
        if self.rule_args:  # drafting options (absent from the keys of plain runs, which stay as they were)
            key["draft_kw"] = {k: _plain(v) for k, v in self.rule_args}
        return key


DRAFT_ARGS = ("shortlist", "confidence", "skip")


def _check_draft_args(method: str, args: dict) -> None:
    if method == "hf-assistant" and args:
        raise ValueError(f"{method} takes no drafting options, got {sorted(args)}")
    valid = DRAFT_ARGS if method == "self-speculation" else ("shortlist", "skip")
    bad = sorted(set(args) - set(valid))
    if bad:
        raise ValueError(f"unknown drafting option(s) {bad} for {method}; valid: {', '.join(valid)}")
    k = args.get("shortlist", 0)
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"shortlist must be an int >= 0 (0: the full vocabulary), got {k!r}")
    sk = args.get("skip", ())
    if not isinstance(sk, (tuple, list)) or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in sk) \
            or len(set(sk)) != len(sk):
        raise ValueError(f"skip must be distinct layer numbers >= 1 (1 = the first layer), got {sk!r}")
    c = args.get("confidence", 0.0)
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.0 <= c < 1.0:
        raise ValueError(f"confidence must be a number in [0, 1) (0: fixed draft length), got {c!r}")


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

    config: DecodeConfig
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

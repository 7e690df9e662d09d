"""What to decode with: :class:`DecodeConfig`, one class per method (what a run did is a
:class:`~earlyexit.engine.result.Result`).

    cfg = DecodeConfig.early_exit("softmax", "lazy-recompute", threshold=0.9, min_layer=15)
    cfg = DecodeConfig.self_speculation(exit_layer=25, draft_len=2)
    cfg = DecodeConfig.hf_assistant(exit_layer=25, draft_len=2)     # transformers' own, as a peer
    cfg = DecodeConfig.hf_generate()                                 # transformers' plain greedy generate
    cfg.label     # 'softmax 0.9 / lazy-recompute'
    cfg.key()     # plain data for a result-cache key
    cfg.run(...)  # what decode() calls: the method's own way of decoding

One class per method (:class:`EarlyExit`, :class:`SelfSpeculation`, :class:`HFAssistant`, :class:`Economize`,
:class:`HFGenerate`), each with its own fields and checks. A configuration is frozen plain data: it hashes,
prints and compares by value, and it never holds a model.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from .fill import STRATEGIES, make_strategy
from .loop import early_exit
from .peers import economize_decode
from .result import COUNTERS, Result, Row, one_by_one
from .rules import RULES, make_rule
from .speculative import (check_draft, hf_assistant_early_exit, hf_generate, self_speculative,
                          shortlist_ids)

METHODS = ("early-exit", "self-speculation", "hf-assistant", "economize", "hf-generate")


def _freeze(v):
    return tuple(_freeze(x) for x in v) if isinstance(v, (list, tuple)) else v


def _plain(v):
    return [_plain(x) for x in v] if isinstance(v, tuple) else v


def _positive_int(method: str, name: str, v) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{method} needs {name} as an int >= 1, got {v!r}")


@dataclass(frozen=True)
class DecodeConfig:
    """One decoding method with its arguments: the base of one class per method.

    :class:`EarlyExit` (an exit rule with a fill strategy), :class:`SelfSpeculation` (LayerSkip: draft with the
    first ``exit_layer`` layers, ``draft_len`` tokens a round, verify with the rest over one cache),
    :class:`HFAssistant` (transformers' ``generate(assistant_early_exit=...)``, the same idea, as a peer),
    :class:`Economize` (the economize library's drafters, a second peer: :mod:`earlyexit.engine.peers`) and
    :class:`HFGenerate` (transformers' plain greedy ``generate``: the peer of this engine's full depth). Each
    holds its own fields, checks them when built, and has its ``label``, its result-cache ``key()`` and the
    ``run`` that decodes with it. Build them with the class methods below (or the classes themselves).
    """

    method: ClassVar[str] = ""
    extra_columns: ClassVar[int] = 0     # cache columns a run needs beyond prompt + max_new_tokens

    def __post_init__(self):
        if type(self) is DecodeConfig:
            raise TypeError("DecodeConfig is the base of the methods' configurations: build one with "
                            "DecodeConfig.early_exit(...), .full(), .self_speculation(...), .hf_assistant(...), "
                            ".economize(...) or .hf_generate()")

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def early_exit(cls, rule: str = "full", strategy: str = "naive-mask", **rule_args) -> "EarlyExit":
        return EarlyExit(rule, strategy, tuple(rule_args.items()))

    @classmethod
    def full(cls) -> "EarlyExit":
        return EarlyExit("full")

    @classmethod
    def self_speculation(cls, exit_layer: int, draft_len: int, **options) -> "SelfSpeculation":
        """LayerSkip's drafting from layer ``exit_layer``, ``draft_len`` tokens a round; see
        :class:`SelfSpeculation` for the options (``shortlist``, ``confidence``, ``skip``)."""
        return SelfSpeculation(exit_layer, draft_len, **_options("self-speculation", options, SelfSpeculation))

    @classmethod
    def hf_assistant(cls, exit_layer: int, draft_len: int, **options) -> "HFAssistant":
        if options:
            raise ValueError(f"hf-assistant takes no drafting options, got {sorted(options)}")
        return HFAssistant(exit_layer, draft_len)

    @classmethod
    def hf_generate(cls) -> "HFGenerate":
        """transformers' own greedy ``generate`` at full depth, as the peer of this engine's full depth."""
        return HFGenerate()

    @classmethod
    def economize(cls, exit_layer: int, draft_len: int, **options) -> "Economize":
        """The economize library's speculative decoding as a peer; see :class:`Economize`."""
        return Economize(exit_layer, draft_len, **_options("economize", options, Economize))

    # -- reading ---------------------------------------------------------------------------------
    @property
    def args(self) -> dict:
        """The method's options as a dict (an exit rule's arguments; a drafter's options that differ from
        their defaults)."""
        return {}

    @property
    def threshold(self) -> float:
        return float("nan")

    @property
    def label(self) -> str:
        raise NotImplementedError

    def key(self) -> dict:
        """Plain data that identifies the configuration (for a result-cache key)."""
        raise NotImplementedError

    def check(self, L: int) -> None:
        """The checks that need the model's depth ``L`` (run by :func:`~earlyexit.engine.decode.decode` before
        any compute)."""

    def columns(self) -> dict:
        """The (rule, strategy) columns of a results table: an early exit's own, the method's name otherwise."""
        return {"rule": self.method, "strategy": self.method}

    def replace(self, **changes) -> "DecodeConfig":
        """A copy with ``changes`` to its fields (``cfg.replace(draft_len=3)``)."""
        valid = [f.name for f in dataclasses.fields(self)]
        bad = sorted(set(changes) - set(valid))
        if bad:
            raise ValueError(f"{self.method} has no field {', '.join(bad)}; valid: {', '.join(valid) or 'none'}")
        return dataclasses.replace(self, **changes)

    def run(self, A, lm, prompts: list[list[int]], N: int, *, pad_id: int, eos_set: set, stop_at_eos: bool,
            progress: bool = False, **early_exit_only) -> "Result":
        """Decode checked ``prompts`` (token-id lists) for ``N`` tokens through the adapter ``A`` of ``lm``.
        The base decodes the prompts one after another (:func:`earlyexit.engine.result.one_by_one`)."""
        unsupported = [k for k, v in early_exit_only.items() if v is not None and v is not False]
        if unsupported:
            raise ValueError(f"{', '.join(unsupported)} apply to early-exit decoding only, not to {self.method}")
        return one_by_one(self, A, lm, prompts, N, pad_id=pad_id, eos_set=eos_set, stop_at_eos=stop_at_eos,
                          progress=progress)

    def decode_row(self, A, lm, prompt: list[int], N: int, *, eos_set: set, stop_at_eos: bool,
                   progress: bool) -> "Row":
        """One prompt, for :meth:`run`'s default."""
        raise NotImplementedError


@dataclass(frozen=True)
class EarlyExit(DecodeConfig):
    """Early exit: exit rule ``rule`` (:data:`earlyexit.engine.rules.RULES`) with its arguments ``rule_args``
    (sorted (name, value) pairs: build it with :meth:`DecodeConfig.early_exit`, which takes them as keywords),
    and fill strategy ``strategy`` (:data:`earlyexit.engine.fill.STRATEGIES`) for what happens above an exit."""

    method: ClassVar[str] = "early-exit"
    rule: str = "full"
    strategy: str = "naive-mask"
    rule_args: tuple = ()

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"unknown exit rule {self.rule!r}; valid: {', '.join(RULES)}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown fill strategy {self.strategy!r}; valid: {', '.join(STRATEGIES)}")
        object.__setattr__(self, "rule_args", tuple(sorted((k, _freeze(v)) for k, v in dict(self.rule_args).items())))

    @property
    def args(self) -> dict:
        return dict(self.rule_args)

    @property
    def threshold(self) -> float:
        return float(self.args.get("threshold", float("nan")))

    @property
    def label(self) -> str:
        kw = self.args
        if self.rule == "static":
            return f"static@{kw.get('layer')}"
        if self.rule == "skipdecode":
            return f"skipdecode {kw.get('e_max')}->{kw.get('e_min')}"
        if "threshold" in kw:
            return f"{self.rule} {kw['threshold']:g} / {self.strategy}"
        return f"{self.rule} / {self.strategy}"

    def key(self) -> dict:
        return {"rule": self.rule, "strategy": self.strategy, "rule_kw": {k: _plain(v) for k, v in self.rule_args}}

    def columns(self) -> dict:
        return {"rule": self.rule, "strategy": self.strategy}

    def replace(self, **changes) -> "EarlyExit":
        """A copy with ``changes``; the rule's arguments by name (``cfg.replace(threshold=0.99)``)."""
        own = {k: changes.pop(k) for k in ("rule", "strategy") if k in changes}
        return EarlyExit(own.get("rule", self.rule), own.get("strategy", self.strategy),
                         tuple({**self.args, **changes}.items()))

    def run(self, A, lm, prompts, N, *, pad_id, eos_set, stop_at_eos, progress=False, force=None,
            return_logits=False, return_kv=False, flush=False, audit_weights=False) -> "Result":
        """All prompts as one batch through the token loop (:func:`earlyexit.engine.loop.early_exit`)."""
        B = len(prompts)
        rule = make_rule(self.rule, A.L, **self.args)
        rule.bind(A)
        if force is not None:
            force = torch.as_tensor(force, dtype=torch.long)
            if force.dim() == 1:
                force = force[None]
            if force.shape != (B, N):
                raise ValueError(f"force must have shape (B, max_new_tokens) = {(B, N)}, got {tuple(force.shape)}")
        return early_exit(A, prompts, N, rule, make_strategy(self.strategy), self, pad_id=pad_id, eos_set=eos_set,
                          force=force, return_logits=return_logits, return_kv=return_kv, flush=flush,
                          progress=progress, audit_weights=audit_weights)


@dataclass(frozen=True)
class _Drafting(DecodeConfig):
    """A speculative method: draft from layer ``exit_layer``, ``draft_len`` tokens a round, verify at full depth."""

    exit_layer: int = 0
    draft_len: int = 0

    def __post_init__(self):
        _positive_int(self.method, "exit_layer", self.exit_layer)
        _positive_int(self.method, "draft_len", self.draft_len)

    @property
    def extra_columns(self) -> int:  # a round may write draft_len + 1 columns past the last token kept
        return self.draft_len + 1

    @property
    def args(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("exit_layer", "draft_len") and getattr(self, f.name) != f.default}

    def key(self) -> dict:
        key = {"method": self.method, "E": self.exit_layer, "d": self.draft_len}
        if self.args:  # drafting options (absent from the keys of plain runs)
            key["draft_kw"] = {k: _plain(v) for k, v in sorted(self.args.items())}
        return key

    def check(self, L: int) -> None:
        check_draft(L, self.exit_layer, self.draft_len, tuple(getattr(self, "skip", ())))


def _options(method: str, options: dict, cls) -> dict:
    valid = [f.name for f in dataclasses.fields(cls) if f.name not in ("exit_layer", "draft_len")]
    bad = sorted(set(options) - set(valid))
    if bad:
        raise ValueError(f"unknown drafting option(s) {bad} for {method}; valid: {', '.join(valid)}")
    return options


def _check_shortlist_skip(shortlist, skip) -> None:
    if not isinstance(shortlist, int) or isinstance(shortlist, bool) or shortlist < 0:
        raise ValueError(f"shortlist must be an int >= 0 (0: the full vocabulary), got {shortlist!r}")
    if not isinstance(skip, (tuple, list)) or any(not isinstance(n, int) or isinstance(n, bool) or n < 1
                                                  for n in skip) or len(set(skip)) != len(skip):
        raise ValueError(f"skip must be distinct layer numbers >= 1 (1 = the first layer), got {skip!r}")


@dataclass(frozen=True)
class SelfSpeculation(_Drafting):
    """LayerSkip's self-speculation. ``shortlist=K`` drafts over the K tokens most frequent in the training
    stream (FR-Spec; verification keeps the full head, so the output is unchanged); ``confidence=c`` stops a
    round's drafting early once a draft's probability (over the shortlist, if any) falls below c, so
    ``draft_len`` becomes the longest draft; ``skip=(n, ...)`` leaves those layers (numbered 1..L) out of the
    draft as well (a layer-skipping draft, Draft & Verify / SWIFT: with ``exit_layer = L`` the draft is the
    whole model minus the skipped layers, read through the full head, and needs no training)."""

    method: ClassVar[str] = "self-speculation"
    shortlist: int = 0
    confidence: float = 0.0
    skip: tuple = ()

    def __post_init__(self):
        super().__post_init__()
        _check_shortlist_skip(self.shortlist, self.skip)
        c = self.confidence
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.0 <= c < 1.0:
            raise ValueError(f"confidence must be a number in [0, 1) (0: fixed draft length), got {c!r}")
        object.__setattr__(self, "skip", tuple(self.skip))

    @property
    def label(self) -> str:
        extra = "".join(f" {n}={v:g}" for v, n in ((self.shortlist, "K"), (self.confidence, "c")) if v)
        if self.skip:
            extra += f" skip {len(self.skip)} layers"
        return f"self-spec E={self.exit_layer} d={self.draft_len}{extra}"

    def decode_row(self, A, lm, prompt, N, *, eos_set, stop_at_eos, progress) -> Row:
        short = shortlist_ids(lm, A, self.shortlist) if self.shortlist else None
        sp = self_speculative(A, prompt, N, self.exit_layer, self.draft_len, eos_set=eos_set, progress=progress,
                              shortlist=short, confidence=float(self.confidence), skip=self.skip)
        counts = {c: torch.zeros(len(sp.tokens)) for c in COUNTERS}   # exact: every count is known
        for i, t in enumerate(sp.round_start):   # a round's counts sit at the first token it emitted
            counts["layers_run"][t] += sp.layers[i]
            counts["head_checks"][t] += sp.heads[i]
            counts["drafted"][t] += sp.drafted[i]
            counts["accepted"][t] += sp.accepted[i]
        return Row(sp.tokens, sp.wall_s, counts, sp.prefill_s, len(sp.round_start), sp.calls, sp.state, sp.step_s)


@dataclass(frozen=True)
class HFAssistant(_Drafting):
    """transformers' ``generate(assistant_early_exit=exit_layer)`` at a constant ``draft_len``: a peer. It is
    exact (no hole, nothing copied or recomputed), but its layers, heads and drafts per token are its own."""

    method: ClassVar[str] = "hf-assistant"

    @property
    def label(self) -> str:
        return f"hf assistant E={self.exit_layer} d={self.draft_len}"

    def decode_row(self, A, lm, prompt, N, *, eos_set, stop_at_eos, progress) -> Row:
        toks, wall = hf_assistant_early_exit(A.model, prompt, N, self.exit_layer, self.draft_len,
                                             stop_at_eos=stop_at_eos)
        zero = torch.zeros(len(toks))
        return Row(toks, wall, {c: zero for c in ("recompute_layers", "copied_kv", "hole_reads", "hole_weight")})


@dataclass(frozen=True)
class Economize(_Drafting):
    """The economize library's speculative decoding: its ``early_exit`` drafter from layer ``exit_layer``, or
    with ``skip=(n, ...)`` its ``layer_skip`` drafter leaving those layers out (give ``exit_layer = L``);
    ``shortlist=K`` wraps the drafter in its ``frspec`` over the same K token ids ours drafts over. It reports
    what it drafted and accepted over the whole run (counted at token 0), not per token."""

    method: ClassVar[str] = "economize"
    shortlist: int = 0
    skip: tuple = ()

    def __post_init__(self):
        super().__post_init__()
        _check_shortlist_skip(self.shortlist, self.skip)
        object.__setattr__(self, "skip", tuple(self.skip))

    @property
    def label(self) -> str:
        what = f"layer_skip {len(self.skip)} layers" if self.skip else f"early_exit E={self.exit_layer}"
        return f"economize {what} d={self.draft_len}" + (f" K={self.shortlist}" if self.shortlist else "")

    def decode_row(self, A, lm, prompt, N, *, eos_set, stop_at_eos, progress) -> Row:
        short = shortlist_ids(lm, A, self.shortlist) if self.shortlist else None
        toks, wall, dr, ac = economize_decode(A.model, prompt, N, self.exit_layer, self.draft_len, skip=self.skip,
                                              shortlist=short, eos_id=sorted(eos_set) or None)
        zero = torch.zeros(len(toks))
        drafted, accepted = zero.clone(), zero.clone()
        drafted[0], accepted[0] = dr, ac
        return Row(toks, wall, {"drafted": drafted, "accepted": accepted,
                                **{c: zero for c in ("recompute_layers", "copied_kv", "hole_reads", "hole_weight")}})


@dataclass(frozen=True)
class HFGenerate(DecodeConfig):
    """transformers' plain greedy ``generate``: full depth, every token runs every layer and the head once."""

    method: ClassVar[str] = "hf-generate"

    @property
    def label(self) -> str:
        return "hf generate (full depth)"

    def key(self) -> dict:
        return {"method": self.method}

    def decode_row(self, A, lm, prompt, N, *, eos_set, stop_at_eos, progress) -> Row:
        toks, wall = hf_generate(A.model, prompt, N, stop_at_eos=stop_at_eos)
        n = len(toks)
        counts = {c: torch.zeros(n) for c in COUNTERS}
        counts["layers_run"] += A.L
        counts["head_checks"] += 1
        return Row(toks, wall, counts)

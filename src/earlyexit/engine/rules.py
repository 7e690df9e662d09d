"""Exit rules: which layers a step runs, and after which of them its token may leave.

Every rule answers the decoding loop through the same three methods:

* ``plan(t)``: the 0-based layers the step producing generated token ``t`` runs, in order (all of them by
  default; SkipDecode's per-position budget skips the middle ones);
* ``checks_at(n, t)``: whether to ask after ``n`` layers have run (layers counted from 1; ``n = L`` is the
  full model);
* ``decide(s)``: given a :class:`StepView` ``s`` (the hidden states, the previous layer's, and, if
  ``rule.needs_logits``, the shared head's logits read through the final norm), a boolean per row:
  exit here or go on. A thresholded rule decides ``score(s) >= λ_t``; its ``score`` is the signal that the
  book's frontier (:mod:`earlyexit.experiments.frontier`) and cost model read, so all three use one formula.

A rule that needs hindsight (``hindsight = True``: the oracle, which compares each layer's prediction with
the full stack's) is asked after the whole plan ran, once per checked layer from the bottom, with the full
stack's prediction in ``s.final``; the loop then rewinds the cache above the chosen exit, so the step costs
what it would have cost had it stopped there.

Thresholds may decay over the generation as in CALM (Schuster et al., 2022, eq. 5):
``λ_t = λ · (0.9 + 0.1 · exp(−τ · t / N))`` with ``t`` the index of the generated token and ``N`` the
number of tokens to generate (``decay_tau = 0`` keeps λ constant).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

RULES = ("full", "static", "softmax", "margin", "saturation", "classifier", "oracle", "skipdecode", "scripted")


@dataclass
class StepView:
    """What a rule sees after ``n`` layers of the step producing generated token ``t`` (b rows)."""

    n: int
    t: int
    n_new: int                          # tokens to generate in all (CALM's N)
    h: torch.Tensor                     # (b, D) hidden state after layer n
    h_prev: torch.Tensor                # (b, D) hidden state before layer n
    logits: torch.Tensor | None = None  # (b, V) head(norm(h)) if the rule needs_logits
    final: torch.Tensor | None = None   # (b,) the full stack's argmax (hindsight rules only)


@dataclass
class ExitRule:
    num_layers: int
    min_layer: int = 1
    check_layers: tuple[int, ...] | None = None  # None: every layer from min_layer to L-1
    name: str = field(init=False, default="rule")
    needs_logits: bool = field(init=False, default=False)
    hindsight: bool = field(init=False, default=False)

    def __post_init__(self):
        L = self.num_layers
        if not isinstance(L, int) or L < 1:
            raise ValueError(f"num_layers must be a positive int, got {L!r}")
        if not 1 <= self.min_layer <= L:
            raise ValueError(f"min_layer must be in [1, {L}], got {self.min_layer}")
        if self.check_layers is not None:
            bad = [c for c in self.check_layers if not (isinstance(c, int) and 1 <= c <= L)]
            if bad:
                raise ValueError(f"check_layers must lie in [1, {L}], got {bad}")
            self.check_layers = tuple(sorted(set(self.check_layers)))

    def bind(self, A) -> None:
        """Called once before decoding with the model's Adapter (a rule that needs the model's pieces or must
        check that it fits the model does it here, before any compute)."""

    def plan(self, t: int):
        """The 0-based layers step ``t`` runs, in order: all of them unless a rule says otherwise."""
        return range(self.num_layers)

    def checks_at(self, n: int, t: int = 0) -> bool:
        if n >= self.num_layers or n < self.min_layer:
            return False
        return self.check_layers is None or n in self.check_layers

    def decide(self, s: StepView) -> torch.Tensor:
        """(b,) bool: which rows exit after ``s.n`` layers."""
        raise NotImplementedError(f"exit rule {self.name!r} does not decide")

    def _all(self, s: StepView) -> torch.Tensor:
        return torch.ones(s.h.shape[0], dtype=torch.bool, device=s.h.device)


@dataclass
class FullDepth(ExitRule):
    """Never exit: the model itself."""

    def __post_init__(self):
        super().__post_init__()
        self.name = "full"

    def checks_at(self, n: int, t: int = 0) -> bool:
        return False


@dataclass
class StaticExit(ExitRule):
    """Every token exits at layer ``layer`` (the static-exit baseline)."""

    layer: int = 0

    def __post_init__(self):
        super().__post_init__()
        self.name = "static"
        if not isinstance(self.layer, int) or not 1 <= self.layer <= self.num_layers:
            raise ValueError(f"static exit layer must be an int in [1, {self.num_layers}], got {self.layer!r}")

    def checks_at(self, n: int, t: int = 0) -> bool:
        return n == self.layer and n < self.num_layers

    def decide(self, s):
        return self._all(s)


@dataclass
class _Thresholded(ExitRule):
    threshold: float = 0.9
    decay_tau: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        if not (isinstance(self.threshold, (int, float)) and 0 < self.threshold <= 1):
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold!r}")
        if not (isinstance(self.decay_tau, (int, float)) and self.decay_tau >= 0):
            raise ValueError(f"decay_tau must be >= 0, got {self.decay_tau!r}")

    def lam(self, t: int, n_new: int) -> float:
        """CALM's decaying threshold λ·(0.9 + 0.1·e^(−τ t / N))."""
        if self.decay_tau == 0:
            return float(self.threshold)
        return float(self.threshold) * (0.9 + 0.1 * math.exp(-self.decay_tau * t / max(n_new, 1)))

    def score(self, s: StepView) -> torch.Tensor:
        """(b,) float: the rule's signal, compared with λ_t (the frontier replays it at other thresholds)."""
        raise NotImplementedError(f"exit rule {self.name!r} has no score")

    def decide(self, s):
        return self.score(s) >= self.lam(s.t, s.n_new)


@dataclass
class SoftmaxConfidence(_Thresholded):
    """Exit when the top-1 probability of the head's softmax is at least λ_t."""

    def __post_init__(self):
        super().__post_init__()
        self.name, self.needs_logits = "softmax", True

    def score(self, s):
        return F.softmax(s.logits.float(), dim=-1).max(dim=-1).values


@dataclass
class Margin(_Thresholded):
    """Exit when top-1 minus top-2 probability is at least λ_t (CALM's softmax response)."""

    def __post_init__(self):
        super().__post_init__()
        self.name, self.needs_logits = "margin", True

    def score(self, s):
        top2 = F.softmax(s.logits.float(), dim=-1).topk(2, dim=-1).values
        return top2[:, 0] - top2[:, 1]


@dataclass
class Saturation(_Thresholded):
    """Exit when cos(h_{n−1}, h_n) ≥ λ_t: the hidden state stopped moving (no head needed)."""

    def __post_init__(self):
        super().__post_init__()
        self.name = "saturation"

    def score(self, s):
        return F.cosine_similarity(s.h.float(), s.h_prev.float(), dim=-1)


@dataclass
class Classifier(_Thresholded):
    """Exit when CALM's learned early-exit classifier (:mod:`earlyexit.engine.classifier`) gives probability
    ≥ λ_t that exiting here keeps the full model's token. No head is read to decide; the head runs once, at
    the exit. ``classifier`` is the classifier's folder: a name under ``data/checkpoints/`` or a path."""

    classifier: str = ""

    def __post_init__(self):
        super().__post_init__()
        self.name = "classifier"
        if not isinstance(self.classifier, str) or not self.classifier:
            raise ValueError("the classifier rule needs classifier=<folder name under data/checkpoints, or a path> "
                             "(train one with earlyexit.training.classifier.ensure)")
        self._clf = None

    def folder(self):
        from pathlib import Path

        from ..paths import DATA

        p = Path(self.classifier)
        return p if p.is_absolute() or p.exists() else DATA / "checkpoints" / self.classifier

    def bind(self, A):
        from .classifier import load_classifier

        clf, _ = load_classifier(self.folder(), hidden_size=A.config.hidden_size, num_layers=A.L,
                                 weights_sha256=A.weights_id)
        self.attach(clf.to(device=A.device, dtype=A.dtype), A.norm)

    def attach(self, clf, norm) -> None:
        """Decide with ``clf`` on ``norm(h)`` (what :meth:`bind` does with the folder's classifier)."""
        self._clf, self._norm = clf, norm

    def score(self, s):
        if self._clf is None:
            raise RuntimeError("the classifier rule was not bound to a model (decode() does this)")
        return torch.sigmoid(self._clf(self._norm(s.h), s.n).float())


@dataclass
class Oracle(ExitRule):
    """Exit at the first layer whose argmax equals the full stack's (run on the same cache).

    Under this rule every emitted token IS the full model's token given the cache the method built,
    so whatever quality is lost is the cache's fault alone. It is a bound, not a method: it needs
    hindsight, so the loop runs the whole stack to know the answer and then rewinds to the exit layer.
    """

    def __post_init__(self):
        super().__post_init__()
        self.name, self.needs_logits, self.hindsight = "oracle", True, True

    def decide(self, s):
        return s.logits.argmax(-1) == s.final


@dataclass
class SkipDecode(ExitRule):
    """SkipDecode (Del Corro et al., 2023): a per-position layer budget, fixed in advance.

    The budget of generated token ``t`` falls linearly from ``e_max`` to ``e_min`` over ``horizon``
    tokens and stays at ``e_min`` after. The token runs the ``warmup`` lowest layers, then the TOP
    ``budget − warmup`` layers, skipping the middle. Because budgets never increase, every token's set
    of layers is contained in every earlier token's, so no token ever attends into a hole.
    """

    e_max: int = 0
    e_min: int = 0
    horizon: int = 32
    warmup: int = 1

    def __post_init__(self):
        super().__post_init__()
        self.name = "skipdecode"
        L = self.num_layers
        if not 1 <= self.e_min <= self.e_max <= L:
            raise ValueError(f"SkipDecode needs 1 <= e_min <= e_max <= {L}, got e_min={self.e_min}, "
                             f"e_max={self.e_max}")
        if not 0 <= self.warmup < self.e_min:
            raise ValueError(f"SkipDecode warm-up must be in [0, e_min={self.e_min}), got {self.warmup}")
        if not self.horizon >= 1:
            raise ValueError(f"SkipDecode horizon must be >= 1, got {self.horizon}")

    def budget(self, t: int) -> int:
        frac = min(t, self.horizon) / self.horizon
        return int(round(self.e_max - frac * (self.e_max - self.e_min)))

    def plan(self, t: int) -> list[int]:
        """0-based indices of the layers the step producing generated token ``t`` runs."""
        b, L, w = self.budget(t), self.num_layers, self.warmup
        return list(range(w)) + list(range(L - (b - w), L))

    def checks_at(self, n: int, t: int = 0) -> bool:
        return False


@dataclass
class Scripted(ExitRule):
    """Exit layer given per generated token: ``exits[t]`` (1..L) for token t (L = full depth).

    Tokens past the end of the script run at full depth. Used to replay a scene exactly and to check
    the cost accounting against a hand count.
    """

    exits: tuple[int, ...] = ()

    def __post_init__(self):
        super().__post_init__()
        self.name = "scripted"
        bad = [e for e in self.exits if not (isinstance(e, int) and 1 <= e <= self.num_layers)]
        if bad:
            raise ValueError(f"scripted exit layers must be ints in [1, {self.num_layers}], got {bad}")
        self.exits = tuple(self.exits)

    def checks_at(self, n: int, t: int = 0) -> bool:
        return t < len(self.exits) and n == self.exits[t] and n < self.num_layers

    def decide(self, s):
        return self._all(s)


def make_rule(name: str, num_layers: int, **kw) -> ExitRule:
    """Build a rule by name; ``kw`` are the rule's fields (threshold, layer, min_layer, ...)."""
    table = {"full": FullDepth, "static": StaticExit, "softmax": SoftmaxConfidence, "margin": Margin,
             "saturation": Saturation, "classifier": Classifier, "oracle": Oracle, "skipdecode": SkipDecode,
             "scripted": Scripted}
    if name not in table:
        raise ValueError(f"unknown exit rule {name!r}; valid: {', '.join(RULES)}")
    cls = table[name]
    valid = {f for f in cls.__dataclass_fields__ if cls.__dataclass_fields__[f].init} - {"num_layers"}
    unknown = set(kw) - valid
    if unknown:
        raise ValueError(f"exit rule {name!r} takes {sorted(valid)}, not {sorted(unknown)}")
    return cls(num_layers=num_layers, **kw)

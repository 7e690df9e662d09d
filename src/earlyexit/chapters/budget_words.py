"""Chapter 7's sentences about the training budget: where a draft breaks even, what the target would take in training
tokens, and why a target is out of reach (re-exported by :mod:`earlyexit.chapters.ch07`)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..experiments import trained
from .words import sig1

SPEED_GOAL = 1.5    # issue 5: speed-up over full depth set as the goal for a trained model
TOO_FAR = 1e12      # tokens: an extension that far says only "not with this recipe at this scale"


def ceil_reason(ceil: tuple, goal: float = SPEED_GOAL) -> str:
    """Why the target is or is not within reach of acceptance alone (``ceil`` from :func:`ceiling`)."""
    s, E, d = ceil
    if s < goal:
        return (f"The reason is in the table's second column: even if every draft were accepted, a round at the "
                f"draft depths and lengths swept could not go faster than {s:.2f}× full depth (at E = {E}, d = {d}), "
                f"because on this CPU the draft's own layers and heads and the verification pass cost nearly as "
                f"much as the tokens they save.")
    return (f"The table's second column is the ceiling: a round whose drafts were all accepted would run at up to "
            f"{s:.2f}× full depth (at E = {E}, d = {d}); what stands between the trained model and it is the "
            f"acceptance, which only training buys.")


def need_sentence(n: pd.DataFrame, target: float | None = None) -> str:
    """The acceptance each (E, d) of ``n`` needs; with ``target``, as "for 1.5× it needs ..." or that none does."""
    listed = "; ".join(f"{r.alpha:.2f} at E = {int(r.E)}, d = {int(r.d)}" if np.isfinite(r.alpha)
                       else f"none at E = {int(r.E)}, d = {int(r.d)}" for r in n.itertuples())
    if target is None:
        return listed
    if n["alpha"].isna().all():
        return f"no acceptance gives {target:.1f}× at any of these depths and lengths"
    return f"for {target:.1f}× it needs {listed}"


def training_needed(rows: pd.DataFrame, t_max: float, tok_step: float, s_step: float, ceil: tuple) -> str:
    """What a target would take in training, as the object of "would take ...": ``rows`` are
    :func:`~earlyexit.experiments.budget.extrapolate`'s for one target and head (every run, E and d),
    ``t_max`` the tokens chapter 6 trained on, ``tok_step`` and ``s_step`` its tokens and seconds a step."""
    reached = rows[rows["alpha_now"] >= rows["alpha_needed"]]
    if len(reached):
        r = reached.loc[(reached["alpha_now"] - reached["alpha_needed"]).idxmax()]
        return (f"no more training than chapter 6's: after its {t_max:,.0f} tokens {_run(r)} already accepts "
                f"{r.alpha_now:.2f} of its drafts, where {r.alpha_needed:.2f} is needed")
    if rows["alpha_needed"].isna().all():
        return (f"no amount of training: it is out of reach at any acceptance, since even a round whose drafts are "
                f"all accepted is predicted at {ceil[0]:.2f}× at best among the draft depths and lengths swept "
                f"(E = {ceil[1]}, d = {ceil[2]})")
    x = rows[rows["tokens_needed"] <= TOO_FAR]
    if not len(x):
        return (f"more training than the fits can say: no fitted line reaches it within {sig1(TOO_FAR)} tokens "
                f"(or the acceptance does not grow along it), so there is no useful extrapolation")
    r = x.loc[x["tokens_needed"].idxmin()]
    if r.tokens_needed <= t_max:
        return (f"about {sig1(r.tokens_needed)} training tokens by the fitted line for {_run(r)}, within the "
                f"{t_max:,.0f} chapter 6 trained on, although its last checkpoint still accepts only "
                f"{r.alpha_now:.2f} where {r.alpha_needed:.2f} is needed")
    days = r.tokens_needed / tok_step * s_step / 86400
    return (f"about {sig1(r.tokens_needed)} training tokens for {_run(r)}, {sig1(r.tokens_needed / t_max)} times "
            f"the {t_max:,.0f} chapter 6 trained on and some {sig1(days)} days of training at this machine's "
            f"{s_step:.1f} s a step{CAVEAT}")


CAVEAT = ": an extrapolation beyond the measured range, which holds only if the fitted trend does"
CAVEAT_BOTH = ": both are extrapolations beyond the measured range, which hold only if the fitted trends do"


def one_caveat(first: str, second: str) -> tuple[str, str]:
    """Two :func:`training_needed` phrases quoted in one sentence ("... would take ``first``, and ... would take
    ``second``"): when both are extrapolations the caveat is said once, at the end."""
    if first.endswith(CAVEAT) and second.endswith(CAVEAT):
        return first[:-len(CAVEAT)], second[:-len(CAVEAT)] + CAVEAT_BOTH
    return first, second


def _run(r) -> str:
    return f"{trained.SHORT_NAMES.get(r.recipe, r.recipe)} at E = {int(r.E)}, d = {int(r.d)}"


def break_even_sentence(need: float, now: float, best: tuple) -> str:
    """Where a draft from the best (E, d) breaks even against what training reached (``need`` NaN: at no
    acceptance on this machine)."""
    if not np.isfinite(need):
        return (f"no acceptance lets a draft from the best depth (E = {best[0]}, d = {best[1]}) break even on this "
                f"machine, where the training of chapter 6 reached {now:.2f}")
    return f"the best depth breaks even only at an acceptance of {need:.2f}, where the training of chapter 6 reached {now:.2f}"


def need_phrase(need: float) -> str:
    """What a one-token draft's acceptance must be to break even (``need`` NaN: no acceptance does)."""
    if not np.isfinite(need):
        return "no acceptance lets a one-token draft break even"
    return f"a one-token draft must be accepted {need:.0%} of the time to break even"

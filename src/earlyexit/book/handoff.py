"""What one chapter takes from another chapter's part of a profile: the models chapter 6 trains, the table of
chapter 8 that the front page shows.

    recipes = handoff.recipes("cpu")                   # {"layerskip": Recipe, ...}: chapter 6's under profile cpu
    lm = handoff.load_trained(P, "layerskip")          # that checkpoint, for a chapter's parameters P

The experiments (:mod:`earlyexit.experiments`) take their parameters as arguments; reading a profile is the
build's business, so it lives here.
"""
from __future__ import annotations

import pandas as pd

from ..experiments import trained
from ..training.checkpoints import Recipe
from .profiles import load_profile


def recipes(profile: str, model: str | None = None) -> dict[str, Recipe]:
    """The recipes chapter 6 trains under ``profile`` (profiles/<profile>.yml); chapters 7 and 8 load them.

    ``model``, when given, must be the profile's model: the trained checkpoint is of that model."""
    p = load_profile(profile).parameters("06_training")
    if model is not None and model != p["model"]:
        raise ValueError(f"profile {profile!r} trains {p['model']!r} in chapter 6, not {model!r}; run chapter 6 "
                         f"with model={model!r} under a profile of your own, or use model={p['model']!r}")
    return trained.recipes(p)


def load_trained(P, which: str = "layerskip", progress: bool = True):
    """The checkpoint ``which`` ("layerskip", "scratch-baseline", "scratch-layerskip") that chapter 6 trains
    under the profile ``P.profile`` for the model ``P.model``, loaded on ``P.device`` in ``P.dtype`` (trained
    first if it is missing)."""
    from ..training import checkpoints

    recipe = recipes(P["profile"], P["model"])[which]
    return checkpoints.load(recipe, device=P["device"], dtype=P["dtype"], progress=progress)


def headline(profile: str, model: str | None = None, device: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The front page's table: (the best point per model and method, :func:`~earlyexit.experiments.compare.best_at`;
    chapter 8's summary table of them, :func:`~earlyexit.experiments.compare.wide_table`) restricted to the
    released and the trained model, with the comparison chapter's parameters under ``profile``. Every number is
    read from the result cache when the comparison chapter has run (the runner executes the front page last)."""
    import torch

    from ..engine.models import load_model
    from ..engine.threads import set_threads
    from ..experiments import classify, evalset
    from ..experiments.compare import best_table, model_points, model_units, summarize, wide_table
    from ..training import checkpoints
    from . import chapter

    p = load_profile(profile).parameters("08_comparison")
    if model is not None and model != p["model"]:
        raise ValueError(f"profile {profile!r} compares {p['model']!r}, not {model!r}")
    before = torch.get_num_threads()
    set_threads(p["threads"])  # timing entries are keyed by the thread count they were measured with
    try:
        dev = device or p["device"]
        released = load_model(p["model"], device=dev, dtype=p["dtype"])
        models = {"released": released}
        if "trained" in p["models"]:
            recipe = recipes(profile, p["model"])["layerskip"]
            models["trained"] = checkpoints.load(recipe, device=dev, dtype=p["dtype"], progress=False)
        es = evalset.eval_set(released, p["prompt_kind"], p["n_prompts"], p["seed"], p["max_prompt_tokens"])
        sset = es.subset(min(p["spec_prompts"], len(es)))
        p9 = load_profile(profile).parameters("09_where_time_goes")
        clf = {k: classify.classifier_for(m, p9) for k, m in models.items()}
        pts = model_points(models, released.num_layers, es, p["max_new_tokens"], p, sset, model_units(models, p9),
                           classifiers=clf,
                           classifier_thresholds=p9["clf_thresholds"])
        summ = summarize(pts, seed=p["seed"], n_boot=p["n_boot"], by=("model", "method", "label"))
        best, _ = best_table(summ, p["target"], chapter.model_names(p["model"]), exclude=("oracle exits", "static exit"))
        return best, wide_table(best, chapter.model_names(p["model"]), {k: m.num_layers for k, m in models.items()})
    finally:
        torch.set_num_threads(before)

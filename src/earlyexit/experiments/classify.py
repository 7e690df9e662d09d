"""Exit decisions without the head, as the chapters use them: CALM's learned classifier trained for a model
under a chapter's parameters, and its quality per layer on the evaluation prompts.

    folder = classify.classifier_for(lm, P)                     # trained once per model and parameters
    cfg = DecodeConfig.early_exit("classifier", "lazy-recompute", classifier=folder, threshold=0.9, min_layer=15)
    q = classify.quality(lm, es, 32, folder, threshold=0.9)    # AUC and precision per layer
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..engine.classifier import load_classifier
from ..training import classifier as train_clf
from . import metrics
from .. import store
from .evalset import EvalSet


def config(P) -> train_clf.ClassifierConfig:
    """The classifier configuration a chapter's parameters ``P`` ask for (``clf_*`` parameters)."""
    return train_clf.ClassifierConfig(n_prompts=P["clf_prompts"], n_new=P["clf_tokens"],
                                      max_prompt_tokens=P["max_prompt_tokens"], min_layer=1,
                                      hidden=P["clf_hidden"], epochs=P["clf_epochs"], seed=P["seed"])


def classifier_for(lm, P) -> str:
    """The folder name (under ``data/checkpoints``) of ``lm``'s classifier for ``P``, trained if missing."""
    return train_clf.ensure(lm, config(P)).name


@torch.inference_mode()
def quality(lm, es: EvalSet, n_new: int, folder: str, threshold: float, min_layer: int = 1) -> pd.DataFrame:
    """Per layer, on the evaluation prompts' oracle labels (does the exit after that layer keep the full model's
    token along its own greedy continuation?): the classifier's AUC, its precision and recall at
    ``threshold``, and the share of positive labels. Cached."""
    def compute():
        from ..engine.rules import make_rule

        rule = make_rule("classifier", lm.num_layers, classifier=folder)
        clf, _ = load_classifier(rule.folder())
        data = train_clf.oracle_labels(lm, es.ids, n_new, min_layer)
        score = torch.sigmoid(clf(data["normed"], data["layer"])).numpy()
        y = data["label"].numpy()
        rows = []
        for n in sorted(set(data["layer"].tolist())):
            sel = data["layer"].numpy() == n
            pred = score[sel] >= threshold
            tp = float((pred & (y[sel] > 0.5)).sum())
            rows.append({"layer": int(n), "auc": metrics.auc(score[sel], y[sel]),
                         "precision": tp / pred.sum() if pred.any() else float("nan"),
                         "recall": tp / (y[sel] > 0.5).sum() if (y[sel] > 0.5).any() else float("nan"),
                         "positives": float(y[sel].mean()), "exits": float(pred.mean()), "n": int(sel.sum())})
        return rows

    params = {"prompts": es.spec, "n_new": n_new, "classifier": folder, "threshold": float(threshold),
              "min_layer": min_layer}
    return store.cached("classifier_quality", params, compute, model=lm)


def overall_auc(q: pd.DataFrame) -> float:
    """The positions-weighted mean AUC over the layers of a :func:`quality` table."""
    ok = q.dropna(subset=["auc"])
    return float(np.average(ok["auc"], weights=ok["n"])) if len(ok) else float("nan")

"""The front page's bottom line, each branch: none, one, many methods at the target; faster, slower, about the
same as full depth."""
import pandas as pd

from earlyexit.chapters import ch00

NAMES = {"released": "SmolLM2 as released", "trained": "SmolLM2 after LayerSkip"}


def _best(rows):
    return pd.DataFrame(rows, columns=["model", "method", "label", "speed", "meets"])


def test_bottom_line_each_branch():
    best = _best([("released", "lazy-recompute", "softmax 0.99", 0.62, True),
                  ("released", "self-speculation", "E=20 d=2", 0.97, True),
                  ("released", "naive-mask", "softmax 0.9", 1.3, False),
                  ("trained", "SkipDecode", "e_min=20", 1.30, True)])
    s = ch00.bottom_line(best, NAMES, 0.95)
    assert s == ("On SmolLM2 as released 2 methods keep a consistency of at least 0.95; the fastest of them is "
                 "self-speculation at E=20 d=2 (exact by construction), predicted at 0.97× full depth: no faster than "
                 "full depth. On SmolLM2 after LayerSkip one method keeps a consistency of at least 0.95; it is "
                 "SkipDecode at e_min=20, predicted at 1.30× full depth: faster than full depth.")
    assert ch00._what("self-speculation", "self-spec E=25 d=2") == "self-speculation at E=25 d=2"
    assert ch00._what("SkipDecode", "skipdecode 30->25") == "SkipDecode at 30->25"
    named = _best([("released", "lazy-recompute", "softmax 0.99 / lazy-recompute", 0.62, True)])
    assert "it is softmax 0.99 / lazy-recompute, predicted" in ch00.bottom_line(named, NAMES, 0.95)
    slow = ch00.bottom_line(_best([("released", "lazy-recompute", "softmax 0.99", 0.6, True)]), NAMES, 0.9)
    assert slow.endswith("predicted at 0.60× full depth: slower than full depth.")
    none = ch00.bottom_line(_best([("trained", "naive-mask", "softmax 0.9", 1.3, False)]), NAMES, 0.95)
    assert none == "On SmolLM2 after LayerSkip no method keeps a consistency of at least 0.95 with the full model."


def test_bottom_line_says_once_what_both_models_share():
    both = _best([("released", "self-speculation", "self-spec E=25 d=2", 0.52, True),
                  ("released", "naive-mask", "softmax 0.9", 1.3, False),
                  ("trained", "self-speculation", "self-spec E=25 d=2", 0.62, True)])
    assert ch00.bottom_line(both, NAMES, 0.9) == (
        "On SmolLM2 as released and SmolLM2 after LayerSkip alike, one method keeps a consistency of at least 0.90; "
        "it is self-speculation at E=25 d=2 (exact by construction), predicted at 0.52× and 0.62× full depth "
        "respectively: slower than full depth.")
    neither = _best([("released", "naive-mask", "softmax 0.9", 1.3, False), ("trained", "naive-mask", "x", 1.2, False)])
    assert ch00.bottom_line(neither, NAMES, 0.9) == ("On SmolLM2 as released and SmolLM2 after LayerSkip alike, no "
                                                     "method keeps a consistency of at least 0.90 with the full model.")
    # the same method but another verdict: two sentences
    apart = _best([("released", "SkipDecode", "e_min=20", 0.9, True), ("trained", "SkipDecode", "e_min=20", 1.2, True)])
    assert ch00.bottom_line(apart, NAMES, 0.9).count("On SmolLM2") == 2

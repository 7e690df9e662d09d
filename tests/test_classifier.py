"""CALM's learned exit classifier: trained reproducibly from oracle labels on training prompts, refused for
another model, and deciding without the vocabulary head (one head evaluation per token, at its exit)."""
import pytest
import torch

from earlyexit.engine import DecodeConfig, decode
from earlyexit.engine.classifier import ExitClassifier, load_classifier, save_classifier
from earlyexit.engine.models import load_model
from earlyexit.training import classifier as C

CFG = C.ClassifierConfig(n_prompts=4, n_new=6, max_prompt_tokens=32, min_layer=2, hidden=8, epochs=3, batch_size=16)


@pytest.fixture(scope="module")
def lm():
    torch.set_num_threads(1)
    return load_model("tiny-llama", device="cpu")


@pytest.fixture(scope="module")
def trained(lm, tmp_path_factory):
    root = tmp_path_factory.mktemp("ck")
    return root, C.ensure(lm, CFG, root=root)


def test_labels_come_from_the_training_split_and_say_whether_the_exit_keeps_the_token(lm):
    ids = C.training_prompts(lm, CFG)
    assert len(ids) == CFG.n_prompts
    d = C.oracle_labels(lm, ids[:2], 5, 2)
    L = lm.num_layers
    assert set(d["layer"].tolist()) == set(range(2, L))
    assert d["normed"].shape == (len(d["label"]), lm.config.hidden_size)
    assert set(d["label"].unique().tolist()) <= {0.0, 1.0}


def test_training_twice_gives_identical_weights_and_resumes_after_the_labels(lm, trained, tmp_path):
    root, folder = trained
    again = C.ensure(lm, CFG, root=tmp_path)
    a, _ = load_classifier(folder)
    b, _ = load_classifier(again)
    for (k, v), (k2, v2) in zip(a.state_dict().items(), b.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    # a run killed after the labels were saved refits without decoding again
    import shutil

    shutil.rmtree(again)
    labels = again.with_name(again.name + ".labels")
    assert (labels / "labels.pt").is_file()
    import earlyexit.training.classifier as mod

    called = []
    orig = mod.oracle_labels
    mod.oracle_labels = lambda *a, **k: called.append(1) or orig(*a, **k)
    try:
        third = C.ensure(lm, CFG, root=tmp_path)
    finally:
        mod.oracle_labels = orig
    assert not called
    c, _ = load_classifier(third)
    assert all(torch.equal(v, w) for v, w in zip(a.state_dict().values(), c.state_dict().values()))


def test_the_rule_reads_the_head_once_per_token_only_at_its_exit(lm, trained):
    root, folder = trained
    cfg = DecodeConfig.early_exit("classifier", "lazy-recompute", classifier=str(folder), threshold=0.3, min_layer=2)
    ids = C.training_prompts(lm, CFG)[:2]
    r = decode(lm, ids, cfg, 8, stop_at_eos=False)
    steps = r.steps()
    assert torch.equal(r.counts["head_checks"][steps], torch.ones(int(steps.sum())))   # never to decide
    calls = r.meta["calls"]["decode"]
    assert not any(k.startswith("head:decide") for k in calls)
    assert sum(n for k, n in calls.items() if k.startswith("check:classifier")) > 0
    assert (r.exit_layer[steps] < lm.num_layers).any(), "the test needs some exits"
    # an exact cache makes the tokens depend on the exits only: lazy and eager recompute agree
    eager = decode(lm, ids, cfg.replace(strategy="eager-recompute"), 8, stop_at_eos=False)
    assert eager.tokens.tolist() == r.tokens.tolist()


def test_a_bad_path_or_another_models_classifier_is_refused_before_compute(lm, trained, tmp_path):
    root, folder = trained
    with pytest.raises(ValueError, match="holds no exit classifier"):
        decode(lm, [[5, 6, 7]], DecodeConfig.early_exit("classifier", classifier=str(tmp_path / "nope")), 4)
    with pytest.raises(ValueError, match="needs classifier="):
        DecodeConfig.early_exit("classifier")
        decode(lm, [[5, 6, 7]], DecodeConfig.early_exit("classifier"), 4)
    other = load_model("tiny-qwen2", device="cpu")           # 4 layers, other weights
    with pytest.raises(ValueError, match="trained for another model"):
        decode(other, [[5, 6, 7]], DecodeConfig.early_exit("classifier", classifier=str(folder)), 4)
    # same shape, other weights: refused by the weights' hash
    clf = ExitClassifier(lm.config.hidden_size, lm.num_layers, 4)
    save_classifier(clf, tmp_path / "c", {"weights_sha256": "0" * 64})
    with pytest.raises(ValueError, match="weights"):
        decode(lm, [[5, 6, 7]], DecodeConfig.early_exit("classifier", classifier=str(tmp_path / "c")), 4)


def test_config_errors_name_what_is_valid():
    with pytest.raises(ValueError, match="n_prompts must be an int >= 1"):
        C.ClassifierConfig(n_prompts=0)
    with pytest.raises(ValueError, match="hidden must be an int >= 0"):
        C.ClassifierConfig(hidden=-1)


def test_rules_without_the_head_read_it_once_per_token_under_each_cache(lm, trained, tmp_path, monkeypatch):
    """Softmax reads the head at every layer it may exit at; saturation and the classifier read it once per token,
    at the exit, whatever the cache."""
    from earlyexit import paths
    from earlyexit.engine import DecodeConfig
    from earlyexit.experiments import points
    from earlyexit.experiments.evalset import eval_set

    monkeypatch.setattr(paths, "CACHE", tmp_path / "cache")
    _, folder = trained
    es = eval_set(lm, "mix", 3, 0, 48)
    EE = DecodeConfig.early_exit
    for s in ("naive-mask", "lazy-recompute"):
        heads = {r: float(points.point(lm, es, 5, c)["head_checks"].mean()) for r, c in (
            ("softmax", EE("softmax", s, min_layer=2, threshold=0.3)),
            ("saturation", EE("saturation", s, min_layer=2, threshold=0.9)),
            ("classifier", EE("classifier", s, min_layer=2, threshold=0.5, classifier=str(folder))))}
        assert heads["classifier"] <= 1.0 + 1e-9 and heads["saturation"] <= 1.0 + 1e-9 and heads["softmax"] > 1.0


def test_a_classifier_another_process_is_training_is_waited_for_not_trained_again(lm, trained, tmp_path, monkeypatch):
    """Chapters run at once need one classifier: the one that finds it claimed waits and reads it."""
    import shutil
    import threading
    import time

    from earlyexit.store import claims
    import earlyexit.training.classifier as mod

    root, folder = trained
    target = C.directory(lm, CFG, tmp_path)
    held = claims.acquire(target.with_name(target.name + ".claim"), "classifier (the other process)")
    monkeypatch.setattr(mod, "oracle_labels", lambda *a, **k: pytest.fail("trained again"))

    def other():                      # the holder finishes its classifier, then lets go
        time.sleep(0.3)
        shutil.copytree(folder, target)
        held.release()

    t = threading.Thread(target=other)
    t.start()
    got = C.ensure(lm, CFG, root=tmp_path)
    t.join()
    assert got == target and (got / "classifier.json").is_file()

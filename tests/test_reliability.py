"""Reliability (issue 7): offline by default, checksums, resource errors, determinism.

Kill-and-resume with a real SIGKILL of a sweep subprocess, and damaged cache entries, are tested in
tests/test_foundation_store.py; bad parameters in tests/test_foundation.py.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch

from earlyexit.book import provenance
from earlyexit.store import results as store
from earlyexit.engine import models as M
from helpers import gen as generate

BLOCKED = "http://127.0.0.1:9"  # the discard port: nothing listens, every connection is refused
HAVE_EMBEDDED = (M.embedded_dir() / M.GGUF_NAME).exists()
needs_embedded = pytest.mark.skipif(not HAVE_EMBEDDED,
                                    reason="embedded model not fetched: run `python -m earlyexit fetch-model`")

# Prepended to a subprocess script: any TCP/UDP connection attempt is recorded and refused.
NO_NETWORK = textwrap.dedent("""
    import socket
    ATTEMPTS = []
    _connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex

    def _guard(real):
        def connect(self, address):
            if self.family in (socket.AF_INET, socket.AF_INET6):
                ATTEMPTS.append(repr(address))
                raise OSError("network blocked by the test")
            return real(self, address)
        return connect

    socket.socket.connect, socket.socket.connect_ex = _guard(_connect), _guard(_connect_ex)
""")


def _env(**extra) -> dict:
    """This environment with the network blocked, and without the offline switches this process set
    (so the subprocess sees the package's defaults); one thread keeps a shared CPU responsive."""
    drop = {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "EARLYEXIT_ALLOW_DOWNLOAD", "EARLYEXIT_DATA"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HTTP_PROXY=BLOCKED, HTTPS_PROXY=BLOCKED, ALL_PROXY=BLOCKED, http_proxy=BLOCKED,
               https_proxy=BLOCKED, all_proxy=BLOCKED, NO_PROXY="", no_proxy="", HF_ENDPOINT=BLOCKED,
               OMP_NUM_THREADS="1", EARLYEXIT_PROGRESS="0", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def _python(script: str, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def one_thread():
    """Deterministic-algorithm flags and the thread count are process-wide: restore them afterwards."""
    saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), torch.backends.cudnn.benchmark,
             torch.backends.cudnn.deterministic)
    torch.set_num_threads(1)  # the same bits at any fixed count; one is fastest on a loaded machine
    yield
    torch.set_num_threads(saved[0])
    torch.use_deterministic_algorithms(saved[1], warn_only=saved[2])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[3], saved[4]


# ---------------------------------------------------------------- 1. offline and safe by default

def test_import_sets_offline_unless_downloads_are_allowed():
    show = "import os, earlyexit; print(os.environ.get('HF_HUB_OFFLINE'), os.environ.get('TRANSFORMERS_OFFLINE'))"
    assert _python(show, _env()).stdout.split() == ["1", "1"]
    assert _python(show, _env(EARLYEXIT_ALLOW_DOWNLOAD="1")).stdout.split() == ["None", "None"]
    assert _python(show, _env(HF_HUB_OFFLINE="0")).stdout.split() == ["0", "1"], "a user's choice wins"


@pytest.mark.embedded
@needs_embedded
def test_embedded_model_loads_and_generates_with_the_network_blocked():
    script = NO_NETWORK + textwrap.dedent("""
        import json, os
        import earlyexit
        from earlyexit.engine import DecodeConfig, decode
        from earlyexit.engine.models import load_model

        lm = load_model("smollm2-135m", device="cpu")
        ids = lm.tokenizer("The capital of France is")["input_ids"]
        tr = decode(lm, [ids], DecodeConfig.full(), 8, stop_at_eos=False)
        try:  # offline, an unknown hub id fails at once: no request, no retries
            load_model("someone/not-here", device="cpu")
            unknown = None
        except ValueError as e:
            unknown = str(e)
        print(json.dumps({"tokens": tr.tokens[0].tolist(), "exits": tr.exit_layer[0].tolist(),
                          "offline": [os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE")],
                          "unknown": unknown, "attempts": ATTEMPTS}))
    """)
    res = _python(script, _env())
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(out["tokens"]) == 8 and out["exits"] == [30] * 8
    assert out["offline"] == ["1", "1"]
    assert out["unknown"] and "\n" not in out["unknown"] and f"'{M.EMBEDDED}'" in out["unknown"]
    assert out["attempts"] == [], "something tried to reach the network"


def test_unknown_hub_id_fails_with_one_clear_line():
    with pytest.raises(ValueError) as ei:
        M.load_model("someone/not-here", device="cpu")
    msg = str(ei.value)
    assert "\n" not in msg and "'someone/not-here'" in msg
    assert f"'{M.EMBEDDED}'" in msg and "EARLYEXIT_ALLOW_DOWNLOAD=1" in msg
    assert ei.value.__cause__ is None and ei.value.__suppress_context__, "no chained traceback wall"


# ---------------------------------------------------------------- 2. checksum of the embedded GGUF

@pytest.fixture(scope="session")
def corrupted_data_dir(tmp_path_factory):
    """A data dir whose embedded GGUF is a copy with one flipped byte (copied once per session)."""
    root = tmp_path_factory.mktemp("corrupted-data")
    target = root / "models" / M.EMBEDDED / M.GGUF_NAME
    target.parent.mkdir(parents=True)
    shutil.copyfile(M.embedded_dir() / M.GGUF_NAME, target)
    with open(target, "r+b") as f:
        f.seek(target.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    return root


@pytest.mark.embedded
@needs_embedded
def test_corrupted_gguf_fails_loudly_before_anything_is_built(corrupted_data_dir):
    script = "from earlyexit.engine.models import load_model\nload_model('smollm2-135m', device='cpu')\n"
    res = _python(script, _env(EARLYEXIT_DATA=str(corrupted_data_dir)))
    gguf = corrupted_data_dir / "models" / M.EMBEDDED / M.GGUF_NAME
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode != 0
    assert last.startswith("earlyexit.engine.models.ChecksumError: "), res.stderr[-2000:]
    assert str(gguf) in last and M.GGUF_SHA256 in last
    assert "Delete it and run `python -m earlyexit fetch-model`" in last, "the fix is named"
    assert [p.name for p in gguf.parent.iterdir()] == [M.GGUF_NAME], "nothing was built from it"


def test_truncated_gguf_is_refused_in_process(tmp_path, monkeypatch):
    """A download cut short: the same ChecksumError, no dequantized copy, no temporary folder."""
    monkeypatch.setattr(M, "MODELS", tmp_path)
    gguf = tmp_path / M.EMBEDDED / M.GGUF_NAME
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF" + bytes(1 << 16))
    with pytest.raises(M.ChecksumError, match="fetch-model") as ei:
        M.prepare_embedded()
    assert str(gguf) in str(ei.value)
    assert list(gguf.parent.iterdir()) == [gguf]


# ---------------------------------------------------------------- 3. resources

def test_out_of_memory_names_the_point_and_keeps_the_finished_ones(tmp_path):
    calls, fail = [], [True]

    def point(n_prompts, max_new_tokens, rule):
        calls.append(n_prompts)
        if n_prompts == 30 and fail[0]:
            raise torch.OutOfMemoryError("simulated: tried to allocate 20.00 GiB")
        return pd.DataFrame({"score": [n_prompts / 7, 0.5]})

    points = [{"n_prompts": n, "max_new_tokens": 64, "rule": "margin"} for n in (10, 20, 30, 40)]
    with pytest.raises(store.ResourceError) as ei:
        store.sweep("oom", points, point, root=tmp_path, model="w" * 64)
    err = ei.value
    msg = str(err)
    assert isinstance(err, RuntimeError) and isinstance(err.__cause__, torch.OutOfMemoryError)
    assert '"n_prompts":30' in msg and '"rule":"margin"' in msg, "the failing point is named"
    assert "lower n_prompts, max_new_tokens or the batch size" in msg
    assert "n_prompts=30, max_new_tokens=64" in msg and "tried to allocate 20.00 GiB" in msg
    assert calls == [10, 20, 30]
    files = sorted(p.name for p in (tmp_path / "oom").iterdir())
    assert len(files) == 4 and sum(f.endswith(".json") for f in files) == 2, files  # no half entry

    fail[0] = False
    table = store.sweep("oom", points, point, root=tmp_path, model="w" * 64)
    assert calls == [10, 20, 30, 30, 40], "the finished points were read, not recomputed"
    assert table["n_prompts"].tolist() == [10, 10, 20, 20, 30, 30, 40, 40]


@pytest.mark.parametrize("exc", [MemoryError, torch.cuda.OutOfMemoryError])
def test_cached_explains_memory_errors_with_a_custom_hint(tmp_path, exc):
    def compute():
        raise exc("CUDA out of memory." if exc is not MemoryError else "")

    with pytest.raises(store.ResourceError, match=r"lower the number of checked layers") as ei:
        store.cached("oom1", {"checks": 30}, compute, root=tmp_path, lower_hint="the number of checked layers")
    assert type(ei.value.__cause__) is exc and "oom1" in str(ei.value)
    assert not (tmp_path / "oom1").exists() or not list((tmp_path / "oom1").iterdir())


def test_other_errors_pass_through_unchanged(tmp_path):
    with pytest.raises(ZeroDivisionError):
        store.cached("boom", {"a": 1}, lambda: 1 / 0, root=tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_gpu_asked_for_and_absent_is_a_clear_error(device):
    with pytest.raises(RuntimeError, match=r"no CUDA GPU is visible; use device='cpu' or 'auto'"):
        M.load_model("tiny-llama", device=device)


# ---------------------------------------------------------------- 4. determinism

def test_set_determinism_seeds_everything_and_says_what_it_set(one_thread):
    rec = provenance.set_determinism(123)
    draws = (random.random(), np.random.rand(), torch.rand(3).tolist())
    again = provenance.set_determinism(123)
    assert (random.random(), np.random.rand(), torch.rand(3).tolist()) == draws
    assert rec == again and json.loads(json.dumps(rec)) == rec, "JSON data for provenance"
    assert rec["seed"] == 123 and rec["torch_deterministic_algorithms"] and rec["deterministic_warn_only"]
    assert torch.are_deterministic_algorithms_enabled() and rec["torch_num_threads"] == 1
    assert rec["cuda"] == torch.cuda.is_available()
    with pytest.raises(ValueError, match="seed"):
        provenance.set_determinism(-1)


def test_set_determinism_on_cuda_records_the_caveat(one_thread, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "x")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")  # restored to unset afterwards
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    rec = provenance.set_determinism(0)
    assert rec["cuda"] and not rec["bitwise_expected"]
    assert rec["cublas_workspace_config"] == ":4096:8"
    assert any("no deterministic implementation" in n for n in rec["notes"])


@pytest.fixture(scope="module")
def tiny():
    with torch.random.fork_rng():
        return M.tiny_model("tiny-llama")


def _prompts(seed: int, vocab: int):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=n).tolist() for n in (7, 4, 9)]


RULE_KW = dict(threshold=0.9, min_layer=2)  # on tiny-llama: exits spread over layers 2..6


def test_generate_gives_byte_identical_logits(tiny, one_thread):
    prompts = _prompts(0, tiny.config.vocab_size)
    runs = [generate(tiny, prompts, 10, rule="saturation", rule_kw=RULE_KW, return_logits=True,
                     stop_at_eos=False) for _ in range(2)]
    a, b = runs
    assert a.logits.numpy().tobytes() == b.logits.numpy().tobytes()
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.exit_layer, b.exit_layer)
    assert torch.equal(a.state, b.state)
    assert len(set(a.exit_layer[:, 1:].flatten().tolist())) > 1, "the rule should exit at several depths"


def test_store_sweeps_are_byte_identical(tiny, one_thread, tmp_path):
    def point(seed, threshold):
        tr = generate(tiny, _prompts(seed, tiny.config.vocab_size), 8, rule="saturation",
                      rule_kw=dict(threshold=threshold, min_layer=2), return_logits=True, stop_at_eos=False)
        B, N = tr.tokens.shape
        return pd.DataFrame({"b": np.repeat(np.arange(B), N), "t": np.tile(np.arange(N), B),
                             "token": tr.tokens.flatten().numpy(), "exit_layer": tr.exit_layer.flatten().numpy(),
                             "top_logit": tr.logits.max(-1).values.flatten().double().numpy()})

    points = [{"seed": s, "threshold": th} for s in (0, 1) for th in (0.6, 0.9)]
    for run in ("a", "b"):  # two cache roots, so the second sweep computes rather than reads
        provenance.set_determinism(0)
        store.sweep("det", points, point, root=tmp_path / run, model="tiny-llama-seed0").to_csv(
            tmp_path / f"{run}.csv", index=False)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    entries = [sorted((tmp_path / r / "det").glob("*.csv")) for r in ("a", "b")]
    assert [p.name for p in entries[0]] == [p.name for p in entries[1]] and len(entries[0]) == 4
    assert [p.read_bytes() for p in entries[0]] == [p.read_bytes() for p in entries[1]]
    table = pd.read_csv(tmp_path / "a.csv")
    assert table["exit_layer"].min() == 2 and table["exit_layer"].max() == 6

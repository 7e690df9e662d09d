"""Sweeps sharded over workers that share one result store: the same table as one process, work stolen from a
killed worker, and the `sweep` command (local processes; torchrun's environment)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from earlyexit import paths
from earlyexit.store import results as store, workers
from earlyexit.book import sweep

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "EARLYEXIT_PROGRESS": "0", "PYTHONUNBUFFERED": "1"}
for k in ("EARLYEXIT_RANK", "EARLYEXIT_WORLD", "RANK", "WORLD_SIZE", "LOCAL_RANK", sweep.WORKER_FLAG):
    ENV.pop(k, None)

SHARD = textwrap.dedent("""
    import sys, time
    import numpy as np, pandas as pd
    from earlyexit.store import results as store

    def point(i, seed):
        print(f"computing {i}", flush=True)
        time.sleep(float(sys.argv[2]))
        return pd.DataFrame({"draw": np.random.default_rng(seed).normal(size=3), "k": np.arange(3)})

    table = store.sweep("shard", [{"i": i, "seed": 100 + i} for i in range(8)], point, root=sys.argv[1], model="w" * 64)
    table.to_csv(sys.argv[3], index=False)
    print("finished", flush=True)
""")


def test_rank_world_and_shares(monkeypatch):
    assert workers.rank_world({}) == (0, 1)
    assert workers.rank_world({"EARLYEXIT_RANK": "2", "EARLYEXIT_WORLD": "3"}) == (2, 3)
    for bad, msg in (({"EARLYEXIT_RANK": "3", "EARLYEXIT_WORLD": "3"}, "0 <= EARLYEXIT_RANK < EARLYEXIT_WORLD"),
                     ({"EARLYEXIT_RANK": "0"}, "set both"), ({"EARLYEXIT_RANK": "a", "EARLYEXIT_WORLD": "2"}, "integer")):
        with pytest.raises(ValueError, match=msg):
            workers.rank_world(bad)
    assert workers.my_share(range(7), 1, 3) == [1, 4]
    calls = []
    monkeypatch.setenv("EARLYEXIT_RANK", "1")
    monkeypatch.setenv("EARLYEXIT_WORLD", "3")
    assert workers.each(range(7), lambda x: calls.append(x) or x * x) == [x * x for x in range(7)]
    assert calls == [1, 4, 0, 1, 2, 3, 4, 5, 6], "its share first, then every item in order"
    monkeypatch.delenv("EARLYEXIT_RANK")
    monkeypatch.delenv("EARLYEXIT_WORLD")
    calls.clear()
    workers.each(range(3), calls.append)
    assert calls == [0, 1, 2], "one process: a plain loop"


def _shard(tmp_path, root, out, rank=None, world=2, delay="0.3"):
    script = tmp_path / "shard.py"
    script.write_text(SHARD)
    env = dict(ENV)
    if rank is not None:
        env.update(EARLYEXIT_RANK=str(rank), EARLYEXIT_WORLD=str(world))
    return subprocess.Popen([sys.executable, str(script), str(root), delay, str(out)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _computed(out: str) -> list[int]:
    return [int(ln.split()[1]) for ln in out.splitlines() if ln.startswith("computing")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The table of an ordinary single-process run."""
    tmp = tmp_path_factory.mktemp("ref")
    p = _shard(tmp, tmp / "store", tmp / "one.csv", delay="0")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return (tmp / "one.csv").read_bytes()


def test_two_workers_share_the_points_and_each_ends_with_the_whole_table(tmp_path, reference):
    procs = [_shard(tmp_path, tmp_path / "store", tmp_path / f"r{r}.csv", rank=r) for r in (0, 1)]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    done = [_computed(out) for out, _ in outs]
    assert sorted(done[0] + done[1]) == list(range(8)), f"a point computed twice or never: {done}"
    assert done[0][:2] == [0, 2] and done[1][:2] == [1, 3], f"each starts with its own share: {done}"
    for r in (0, 1):
        assert (tmp_path / f"r{r}.csv").read_bytes() == reference


def test_a_killed_worker_loses_only_its_current_point(tmp_path, reference):
    """Worker 1 of 2 alone, killed while computing point 3 (its second): only point 1 is stored, and the claim
    it left on 3 does not hold up the rerun, which computes exactly the missing points."""
    root = tmp_path / "store"
    p = _shard(tmp_path, root, tmp_path / "killed.csv", rank=1)
    for line in p.stdout:
        if line.startswith("computing 3"):
            break
    p.send_signal(signal.SIGKILL)
    p.wait()
    complete = sorted(store.read("shard", {"i": i, "seed": 100 + i}, model="w" * 64, root=root) is not None
                      for i in range(8))
    assert complete.count(True) == 1 and store.read("shard", {"i": 1, "seed": 101}, model="w" * 64, root=root) is not None
    assert len(list((root / "shard").glob("*.claim"))) == 1, "the killed worker's claim is left behind"
    t0 = time.perf_counter()
    p = _shard(tmp_path, root, tmp_path / "rerun.csv")
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    assert _computed(out) == [0, 2, 3, 4, 5, 6, 7]
    assert time.perf_counter() - t0 < 60, "the rerun waited for the dead worker's claim"
    assert (tmp_path / "rerun.csv").read_bytes() == reference
    assert not list((root / "shard").glob("*.claim"))


def test_the_other_worker_completes_the_points_of_a_killed_one(tmp_path, reference):
    root = tmp_path / "store"
    p1 = _shard(tmp_path, root, tmp_path / "r1.csv", rank=1, delay="0.5")
    for line in p1.stdout:
        if line.startswith("computing 3"):
            break
    p0 = _shard(tmp_path, root, tmp_path / "r0.csv", rank=0, delay="0.5")
    p1.send_signal(signal.SIGKILL)
    p1.wait()
    out, err = p0.communicate(timeout=180)
    assert p0.returncode == 0, err
    assert sorted(_computed(out)) == [0, 2, 3, 4, 5, 6, 7], "worker 0 steals 3 (claimed by the dead one), 5 and 7"
    assert (tmp_path / "r0.csv").read_bytes() == reference


TIMING_COLUMNS = ("batch_tok_s", "wall_s")


def _entries(cache: Path) -> dict[str, bytes]:
    """Every entry's CSV, with the wall-clock columns (which differ between any two runs) removed."""
    out = {}
    for csv in sorted(cache.rglob("*.csv")):
        df = pd.read_csv(csv, dtype=str, keep_default_na=False)
        out[str(csv.relative_to(cache))] = df.drop(columns=[c for c in TIMING_COLUMNS if c in df]).to_csv(index=False).encode()
    return out


def _data_dir(tmp: Path) -> Path:
    d = tmp / "data"
    d.mkdir(parents=True)
    (d / "models").symlink_to(paths.MODELS)  # the embedded tokenizer, which the tiny models use
    return d


# ------------------------------------------------------------------------------------- the command

@pytest.fixture
def no_launch(monkeypatch):
    calls = []
    monkeypatch.setattr(sweep, "launch", lambda argv, n, profile, selected: calls.append((n, selected)) or 0)
    monkeypatch.setattr(sweep, "work", lambda profile, selected, rank, world: calls.append((rank, world)) or 0)
    for k in ("EARLYEXIT_RANK", "EARLYEXIT_WORLD", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
              sweep.WORKER_FLAG):
        monkeypatch.delenv(k, raising=False)
    return calls


@pytest.mark.parametrize("argv, msg", [
    (["--workers", "0"], "--workers must be a positive number"),
    (["--only", "02_naive_colapse"], "unknown notebook '02_naive_colapse' (did you mean '02_naive_collapse'?)"),
    (["--profile", "smok"], "unknown profile 'smok' (did you mean 'smoke'?)"),
])
def test_usage_errors_stop_before_any_work(no_launch, capsys, argv, msg):
    assert sweep.main(["--profile", "smoke", *argv] if "--profile" not in argv else argv) == 2
    assert msg in capsys.readouterr().err
    assert no_launch == []


def test_more_cpu_workers_than_cores_needs_force(no_launch, capsys, monkeypatch):
    monkeypatch.setattr(sweep, "cpu_count", lambda: 2)
    assert sweep.main(["--profile", "smoke", "--workers", "3"]) == 2
    assert "3 CPU workers on this machine but only 2 core(s)" in capsys.readouterr().err
    assert sweep.main(["--profile", "smoke", "--workers", "3", "--force", "--only", "02_naive_collapse"]) == 0
    assert no_launch == [(3, ["02_naive_collapse"])]


def test_under_torchrun_each_rank_is_one_worker(no_launch, capsys, monkeypatch):
    monkeypatch.setattr(sweep, "cpu_count", lambda: 4)
    for k, v in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)
    assert sweep.main(["--profile", "smoke"]) == 0
    assert no_launch == [(3, 4)]
    assert sweep.main(["--profile", "smoke", "--workers", "2"]) == 2
    assert "torchrun started 4 ranks" in capsys.readouterr().err
    monkeypatch.setattr(sweep, "cpu_count", lambda: 1)
    assert sweep.main(["--profile", "smoke"]) == 2  # 2 ranks on this machine, 1 core
    assert "2 CPU workers on this machine but only 1 core(s)" in capsys.readouterr().err


def test_a_cuda_profile_without_a_gpu_is_refused(no_launch, capsys, monkeypatch):
    monkeypatch.setattr(sweep, "visible_gpus", lambda: [])
    assert sweep.main(["--profile", "gpu", "--only", "02_naive_collapse"]) == 2
    assert "runs on cuda, but no CUDA GPU is visible" in capsys.readouterr().err
    monkeypatch.setattr(sweep, "visible_gpus", lambda: ["0", "1"])
    assert sweep.main(["--profile", "gpu", "--only", "02_naive_collapse", "--workers", "3"]) == 2
    assert "3 workers on this machine but 2 GPU(s) visible" in capsys.readouterr().err
    assert no_launch == []


def test_torchrun_ranks_take_their_own_gpu(monkeypatch):
    from earlyexit.book import runner

    prof = runner.load_profile("gpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert sweep.pin_gpu(1, 3, prof, ["02_naive_collapse"]) and os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert sweep.pin_gpu(2, 3, prof, ["02_naive_collapse"]) and os.environ["CUDA_VISIBLE_DEVICES"] == "2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(runner.UsageError, match="start one rank per GPU"):
        sweep.pin_gpu(1, 2, prof, ["02_naive_collapse"])
    assert not sweep.pin_gpu(0, 2, runner.load_profile("smoke"), ["02_naive_collapse"])  # a CPU profile


def test_the_sweep_command_fills_the_store_like_one_process(tmp_path):
    """`sweep --workers 2` and `sweep --workers 1` on the smoke profile's chapter 2 (run at the same time, into two
    data folders): the same entries with the same bytes (wall-clock columns aside), and nothing written to the
    book's executed notebooks or figures."""
    generated = REPO / "book" / "generated" / "02_naive_collapse.ipynb"
    before = generated.stat().st_mtime_ns if generated.exists() else None
    procs, data = {}, {}
    t0 = time.perf_counter()
    for n in (2, 1):
        data[n] = _data_dir(tmp_path / f"w{n}")
        env = {**ENV, "EARLYEXIT_DATA": str(data[n])}
        procs[n] = subprocess.Popen([sys.executable, "-m", "earlyexit", "sweep", "--profile", "smoke", "--only",
                                     "02_naive_collapse", "--workers", str(n), "--force"], env=env, cwd=REPO,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outs = {n: p.communicate(timeout=580) for n, p in procs.items()}
    for n, p in procs.items():
        assert p.returncode == 0, outs[n][1][-3000:]
    print(f"2 workers and 1 worker side by side: {time.perf_counter() - t0:.0f} s")
    assert "[worker 0/2] 02_naive_collapse: done" in outs[2][0] and "[worker 1/2] 02_naive_collapse: done" in outs[2][0]
    two, one = _entries(data[2] / "cache"), _entries(data[1] / "cache")
    assert len(one) > 10 and two == one
    assert not [p for p in (data[2] / "cache").rglob("*") if p.is_file() and p.suffix not in (".csv", ".json")]
    assert (generated.stat().st_mtime_ns if generated.exists() else None) == before

"""The sweep result cache: resume after a kill, detect corruption, reproduce bytes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest

from earlyexit.store import results as store

SWEEP_SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np, pandas as pd
    from earlyexit.store import results as store

    def point(i, seed):
        print(f"computing {i}", flush=True)
        time.sleep(float(sys.argv[2]))
        rng = np.random.default_rng(seed)
        return pd.DataFrame({"draw": rng.normal(size=3), "k": np.arange(3), "tag": [f"p{i}"] * 3})

    points = [{"i": i, "seed": 100 + i} for i in range(6)]
    table = store.sweep("resume", points, point, root=sys.argv[1], model="w" * 64)
    table.to_csv(sys.argv[3], index=False)
    print("finished", flush=True)
""")


def _run_sweep(tmp_path, root, out, delay="0"):
    script = tmp_path / "sweep.py"
    script.write_text(SWEEP_SCRIPT)
    env = {**os.environ, "EARLYEXIT_PROGRESS": "0"}
    return subprocess.Popen([sys.executable, str(script), str(root), delay, str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_killed_sweep_resumes_and_matches_an_uninterrupted_run(tmp_path):
    root = tmp_path / "cache"
    proc = _run_sweep(tmp_path, root, tmp_path / "killed.csv", delay="0.4")
    seen = []
    deadline = time.time() + 120
    for line in proc.stdout:  # kill while point 3 is being computed: 0..2 are complete
        seen.append(line.strip())
        if line.startswith("computing 3") or time.time() > deadline:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert seen[-1] == "computing 3", seen
    assert not (tmp_path / "killed.csv").exists()
    complete = list((root / "resume").glob("*.json"))
    assert len(complete) == 3, "exactly the finished points are complete entries"

    proc = _run_sweep(tmp_path, root, tmp_path / "resumed.csv")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert [ln for ln in out.splitlines() if ln.startswith("computing")] == \
        ["computing 3", "computing 4", "computing 5"], "a finished point was recomputed"

    proc = _run_sweep(tmp_path, tmp_path / "fresh", tmp_path / "fresh.csv")
    assert proc.communicate(timeout=120)[0].count("computing") == 6
    assert (tmp_path / "resumed.csv").read_bytes() == (tmp_path / "fresh.csv").read_bytes()
    assert not list((root / "resume").glob(".*.tmp")), "a temporary file was left as if complete"


def _compute(calls):
    def fn():
        calls.append(1)
        return pd.DataFrame({"x": [0.1, 0.2, 1 / 3], "n": [1, 2, 3], "ok": [True, False, True],
                             "s": ["a", "", "c d"]})
    return fn


def _entry(root, name="exp"):
    (csv,) = (root / name).glob("*.csv")
    return csv, csv.with_suffix(".json")


@pytest.mark.parametrize("damage", ["flip_byte", "truncate_table", "garbage_meta", "remove_table"])
def test_corrupted_entry_is_detected_and_recomputed(tmp_path, damage):
    calls = []
    first = store.cached("exp", {"a": 1}, _compute(calls), root=tmp_path)
    csv, meta = _entry(tmp_path)
    if damage == "flip_byte":
        data = bytearray(csv.read_bytes())
        data[5] ^= 0x01
        csv.write_bytes(bytes(data))
    elif damage == "truncate_table":
        csv.write_bytes(csv.read_bytes()[:-7])
    elif damage == "garbage_meta":
        meta.write_text("{ not json")
    else:
        csv.unlink()
    with pytest.warns(RuntimeWarning, match="corrupted"):
        again = store.cached("exp", {"a": 1}, _compute(calls), root=tmp_path)
    assert len(calls) == 2
    pd.testing.assert_frame_equal(first, again)
    assert store.cached("exp", {"a": 1}, _compute(calls), root=tmp_path).equals(first)
    assert len(calls) == 2, "the repaired entry is read, not recomputed"


def test_table_without_metadata_is_not_taken_as_complete(tmp_path):
    calls = []
    store.cached("exp", {"a": 1}, _compute(calls), root=tmp_path)
    csv, meta = _entry(tmp_path)
    meta.unlink()  # as if killed between writing the table and its metadata
    (tmp_path / "exp" / ".stray.csv.tmp").write_text("half a fi")
    store.cached("exp", {"a": 1}, _compute(calls), root=tmp_path)
    assert len(calls) == 2


def test_round_trip_keeps_values_and_dtypes(tmp_path):
    calls = []
    direct = _compute([])()
    cached = store.cached("exp", {"a": 1}, _compute(calls), root=tmp_path)
    read = store.cached("exp", {"a": 1}, _compute(calls), root=tmp_path)
    pd.testing.assert_frame_equal(cached, read)
    pd.testing.assert_frame_equal(cached, direct, check_dtype=False)
    assert list(cached.dtypes.astype(str))[:3] == ["float64", "int64", "bool"]
    assert cached["x"].tolist() == [0.1, 0.2, 1 / 3]  # exact floats, not rounded


def test_same_seed_gives_identical_bytes(tmp_path):
    import numpy as np

    def fn():
        return pd.DataFrame({"v": np.random.default_rng(7).normal(size=50)})

    for root in ("r1", "r2"):
        store.cached("exp", {"seed": 7}, fn, root=tmp_path / root, model="m" * 64)
    a, b = (sorted((tmp_path / r / "exp").iterdir()) for r in ("r1", "r2"))
    assert [p.name for p in a] == [p.name for p in b]
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]


def test_key_depends_on_name_params_weights_and_code():
    base = store.entry_key("exp", {"a": 1}, "w1", code="c1")
    assert base == store.entry_key("exp", {"a": 1}, "w1", code="c1")
    assert base == store.entry_key("exp", dict(reversed(list({"a": 1}.items()))), "w1", code="c1")
    assert len({base, store.entry_key("exp2", {"a": 1}, "w1", code="c1"),
                store.entry_key("exp", {"a": 2}, "w1", code="c1"),
                store.entry_key("exp", {"a": 1}, "w2", code="c1"),
                store.entry_key("exp", {"a": 1}, "w1", code="c2")}) == 5


def test_sweep_adds_point_columns_and_rejects_bad_results(tmp_path):
    table = store.sweep("sq", [{"i": i, "label": f"p{i}"} for i in range(3)],
                        lambda i, label: {"sq": i * i}, root=tmp_path)
    assert list(table.columns) == ["i", "label", "sq"]
    assert table["sq"].tolist() == [0, 1, 4]
    with pytest.raises(TypeError, match="must return a DataFrame"):
        store.cached("bad", {}, lambda: 42, root=tmp_path)
    with pytest.raises(ValueError):
        store.cached("../up", {}, lambda: {"a": 1}, root=tmp_path)

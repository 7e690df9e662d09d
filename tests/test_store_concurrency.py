"""One result store, several processes: entries never corrupted, a point computed once, dead claims taken over."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from earlyexit.store import claims
from earlyexit.store import results as store

W = "w" * 64
ENV = {**os.environ, "EARLYEXIT_PROGRESS": "0", "PYTHONUNBUFFERED": "1"}

RACE = textwrap.dedent("""
    import sys, time
    import numpy as np, pandas as pd
    from earlyexit.store import results as store

    def barrier(folder, n):             # start together: wait until all n processes are up
        import os, pathlib
        d = pathlib.Path(folder); d.mkdir(parents=True, exist_ok=True)
        (d / f"up.{os.getpid()}").touch()
        while len(list(d.glob("up.*"))) < n:
            time.sleep(0.001)

    root, n, refresh = sys.argv[1], int(sys.argv[2]), sys.argv[4] == "1"
    reverse = len(sys.argv) > 5 and sys.argv[5] == "reverse"
    barrier(sys.argv[3], 2)
    for i in (reversed(range(n)) if reverse else range(n)):
        def compute(i=i):
            print(f"computed {i}", flush=True)
            time.sleep(0.01)            # a point takes time: the other process is up before this one is done
            return pd.DataFrame({"i": [i] * 40, "v": np.arange(40) * (i + 0.5), "s": [f"row {k}" for k in range(40)]})
        key = 0 if refresh else i
        df = store.cached("race", {"i": key}, compute, root=root, model="w" * 64, refresh=refresh)
        assert len(df) == 40 and (refresh or df["i"].tolist() == [i] * 40), df
    print("ok", flush=True)
""")

# writers that bypass the claim on purpose (each its own table for one key, like a timing point), and a reader
RAW = textwrap.dedent("""
    import sys, time
    import numpy as np, pandas as pd
    from earlyexit.store import results as store

    def barrier(folder, n):             # start together: wait until all n processes are up
        import os, pathlib
        d = pathlib.Path(folder); d.mkdir(parents=True, exist_ok=True)
        (d / f"up.{os.getpid()}").touch()
        while len(list(d.glob("up.*"))) < n:
            time.sleep(0.001)

    root, role, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    barrier(sys.argv[4], 3)
    name, params = "raw", {"k": 1}
    key, csv, meta = store._paths(name, params, "w" * 64, root)
    if role == "reader":
        seen = none = 0
        up = __import__("pathlib").Path(sys.argv[4])
        while len(list(up.glob("done.*"))) < 2 or seen + none < n:  # read while both writers write, n at least
            df = store.read(name, params, model="w" * 64, root=root)
            none += df is None
            if df is not None:
                w = df["writer"].iloc[0]
                assert df["writer"].tolist() == [w] * 200 and df["v"].tolist() == [float(w) * 7 + k for k in range(200)], df
                seen += 1
        print(f"none {none} read {seen}", flush=True)
    else:
        w = int(role)
        for _ in range(n):
            store._compute_and_write(name, params, lambda: pd.DataFrame({"writer": [w] * 200,
                                     "v": [float(w) * 7 + k for k in range(200)]}), "w" * 64, key, csv, meta, None)
        (__import__("pathlib").Path(sys.argv[4]) / f"done.{w}").touch()
        print("wrote", flush=True)
""")

HOLD = textwrap.dedent("""
    import sys, time
    import pandas as pd
    from earlyexit.store import results as store

    root, seconds = sys.argv[1], float(sys.argv[2])
    def compute():
        print("started", flush=True)
        time.sleep(seconds)
        return pd.DataFrame({"who": ["holder"], "x": [1]})
    store.cached("held", {"a": 1}, compute, root=root, model="w" * 64)
    print("done", flush=True)
""")


def _script(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _start(script, *args, env=None):
    return subprocess.Popen([sys.executable, script, *map(str, args)], env=env or ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(proc, line, timeout=120):
    deadline = time.time() + timeout
    for got in proc.stdout:
        if got.strip() == line:
            return
        assert time.time() < deadline, f"no {line!r} within {timeout} s"
    raise AssertionError(f"process ended before printing {line!r}: {proc.stderr.read()}")


@pytest.mark.parametrize("order", ["same", "opposite"])
def test_two_processes_racing_on_the_same_keys_compute_each_once(tmp_path, order):
    """2 processes ask for the same 100 missing entries, started together: every entry is computed exactly once
    in all (the claim), both read equal, complete tables, and nothing is left over.

    In the same order the two contend for every entry; which one computes is up to the scheduler (the one that
    wins the first claim may stay ahead throughout while the other waits at each entry), so only exactly-once is
    asserted. In opposite orders they meet in the middle, so each must have computed some."""
    n = 100
    script = _script(tmp_path, "race.py", RACE)
    orders = ["forward", "forward"] if order == "same" else ["forward", "reverse"]
    procs = [_start(script, tmp_path / "store", n, tmp_path / "up", 0, o) for o in orders]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    computed = sorted(int(ln.split()[1]) for out, _ in outs for ln in out.splitlines() if ln.startswith("computed"))
    assert computed == list(range(n)), "an entry was computed twice (or never)"
    print("computed by each process:", [out.count("computed") for out, _ in outs])
    if order == "opposite":
        assert all(out.count("computed") > 0 for out, _ in outs), "one process did all the work: they never met"
    folder = tmp_path / "store" / "race"
    assert len(list(folder.glob("*.json"))) == n
    assert not [p.name for p in folder.iterdir() if p.suffix not in (".csv", ".json")], "claim or temp files left"
    for i in range(n):
        assert store.read("race", {"i": i}, model=W, root=tmp_path / "store")["i"].tolist() == [i] * 40


def test_refreshes_racing_on_one_key_take_turns(tmp_path):
    """refresh=True recomputes on purpose: 2 processes x 40 refreshes of ONE key take turns under its claim."""
    script = _script(tmp_path, "race.py", RACE)
    procs = [_start(script, tmp_path / "store", 40, tmp_path / "up", 1) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert sum(out.count("computed") for out, _ in outs) == 80
    df = store.read("race", {"i": 0}, model=W, root=tmp_path / "store")
    assert df is not None and len(df) == 40


def test_writers_without_a_claim_never_show_a_reader_a_mixed_entry(tmp_path):
    """Even with the claim bypassed (2 writers x 150 rewrites of one key, each its own table) a reader polling
    the entry all the while only ever gets one writer's whole table, or nothing while a write is half done."""
    script = _script(tmp_path, "raw.py", RAW)
    procs = [_start(script, tmp_path / "store", role, n, tmp_path / "up")
             for role, n in (("0", 150), ("1", 150), ("reader", 100))]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    none, seen = int(outs[2][0].split()[1]), int(outs[2][0].split()[3])
    print(f"reader: {seen} whole tables, {none} reads of no entry")
    assert seen > 0, "the reader never saw an entry: nothing was tested"
    # what the writers leave: one writer's whole table, or (their last two writes interleaved: the csv of one, the
    # json of the other, which the claim exists to prevent) an entry that fails its checksum and reads as
    # missing; never a mix
    df = store.read("raw", {"k": 1}, model=W, root=tmp_path / "store")
    assert df is None or df["writer"].nunique() == 1


def test_a_live_claim_is_waited_for_not_computed_again(tmp_path):
    script = _script(tmp_path, "hold.py", HOLD)
    holder = _start(script, tmp_path, 3)
    _wait_for(holder, "started")
    calls = []
    t0 = time.perf_counter()
    df = store.cached("held", {"a": 1}, lambda: calls.append(1) or {"who": "me", "x": 2}, root=tmp_path, model=W)
    waited = time.perf_counter() - t0
    holder.communicate(timeout=60)
    assert calls == [] and df["who"].tolist() == ["holder"]
    assert waited > 0.5, "it did not wait for the holder"


def test_an_entry_in_progress_counts_as_there_only_while_its_claim_is_live(tmp_path):
    """``has(or_claimed=True)``: chapter 8 asks whether chapter 7's timed point exists or is being timed, so that
    it waits for it rather than timing a second one beside it."""
    key, csv, _ = store._paths("hb", {"a": 1}, W, tmp_path)
    lock = csv.with_suffix(".claim")
    assert not store.has("hb", {"a": 1}, model=W, root=tmp_path, or_claimed=True)
    _claim_file(lock, host="elsewhere", pid=1, heartbeat=time.time())
    assert store.has("hb", {"a": 1}, model=W, root=tmp_path, or_claimed=True)
    assert not store.has("hb", {"a": 1}, model=W, root=tmp_path), "without or_claimed only a written entry counts"
    _claim_file(lock, host="elsewhere", pid=1, heartbeat=time.time() - claims.STALE_S - 5)
    assert not store.has("hb", {"a": 1}, model=W, root=tmp_path, or_claimed=True), "a stale claim computes nothing"
    lock.unlink()
    store.cached("hb", {"a": 1}, lambda: {"x": 1}, root=tmp_path, model=W)
    assert store.has("hb", {"a": 1}, model=W, root=tmp_path) and store.has("hb", {"a": 1}, model=W, root=tmp_path,
                                                                           or_claimed=True)


def test_waiting_too_long_names_the_holder(tmp_path, monkeypatch):
    script = _script(tmp_path, "hold.py", HOLD)
    holder = _start(script, tmp_path, 20)
    try:
        _wait_for(holder, "started")
        monkeypatch.setenv("EARLYEXIT_CLAIM_WAIT_S", "0.5")
        with pytest.raises(claims.ClaimTimeout) as e:
            store.cached("held", {"a": 1}, lambda: {"x": 0}, root=tmp_path, model=W)
        msg = str(e.value)
        assert f"pid {holder.pid} on {claims.HOST}" in msg and "EARLYEXIT_CLAIM_WAIT_S" in msg and ".claim" in msg
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
def test_the_claim_of_a_killed_process_is_taken_over_at_once(tmp_path, reap):
    script = _script(tmp_path, "hold.py", HOLD)
    holder = _start(script, tmp_path, 60)
    _wait_for(holder, "started")
    holder.send_signal(signal.SIGKILL)
    if reap:
        holder.wait()
    else:  # not reaped yet: a zombie, whose pid still exists
        time.sleep(0.5)
    (lock,) = (tmp_path / "held").glob("*.claim")
    assert json.loads(lock.read_text())["pid"] == holder.pid
    assert not list((tmp_path / "held").glob("*.json")), "the killed computation left an entry"
    t0 = time.perf_counter()
    df = store.cached("held", {"a": 1}, lambda: {"who": "me", "x": 2}, root=tmp_path, model=W)
    assert time.perf_counter() - t0 < claims.STALE_S / 4, "it waited for the dead process's claim"
    assert df["who"].tolist() == ["me"] and not lock.exists()
    holder.wait()


def _claim_file(path, **info):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"token": "t", "started": time.time(), **info}))


def test_stale_and_live_claims_by_their_heartbeat(tmp_path, monkeypatch):
    """A claim from another host is live while its heartbeat is fresh and taken over once it is older than the
    limit; a claim with this process's pid that this process does not hold (a reused pid) is stale."""
    key, csv, _ = store._paths("hb", {"a": 1}, W, tmp_path)
    lock = csv.with_suffix(".claim")
    monkeypatch.setenv("EARLYEXIT_CLAIM_WAIT_S", "0.3")
    _claim_file(lock, host="elsewhere", pid=1, heartbeat=time.time())
    with pytest.raises(claims.ClaimTimeout, match="pid 1 on elsewhere"):
        store.cached("hb", {"a": 1}, lambda: {"x": 1}, root=tmp_path, model=W)
    _claim_file(lock, host="elsewhere", pid=1, heartbeat=time.time() - claims.STALE_S - 5)
    assert store.cached("hb", {"a": 1}, lambda: {"x": 1}, root=tmp_path, model=W)["x"].tolist() == [1]
    _claim_file(lock, host=claims.HOST, pid=os.getpid(), heartbeat=time.time())
    assert store.cached("hb", {"a": 1}, lambda: {"x": 2}, root=tmp_path, model=W, refresh=True)["x"].tolist() == [2]
    assert not lock.exists()


def test_the_heartbeat_keeps_a_long_computation_live(tmp_path, monkeypatch):
    """With a stale limit shorter than the computation, the holder's heartbeat keeps its claim; with the
    heartbeat (almost) off, the same claim is taken over."""
    script = _script(tmp_path, "hold.py", HOLD)
    for beat, taken in (("0.2", False), ("1000", True)):
        root = tmp_path / f"beat{beat}"
        env = {**ENV, "EARLYEXIT_CLAIM_HEARTBEAT_S": beat, "EARLYEXIT_CLAIM_STALE_S": "1.5"}
        holder = _start(script, root, 4, env=env)
        _wait_for(holder, "started")
        monkeypatch.setenv("EARLYEXIT_CLAIM_STALE_S", "1.5")
        calls = []
        df = store.cached("held", {"a": 1}, lambda: calls.append(1) or {"who": "me", "x": 2}, root=root, model=W)
        holder.communicate(timeout=60)
        assert (calls == [1]) is taken and df["who"].iloc[0] == ("me" if taken else "holder")

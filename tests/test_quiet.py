"""A measurement that needs the machine to itself: the runner pauses the notebooks beside it, kernels included."""
from __future__ import annotations

import sys

import pytest

from earlyexit import paths, quiet
from earlyexit.book import jobs

# a notebook beside: its kernel (a grandchild, as papermill's kernel is) ticks a timestamp into a file
GRAND = """
import sys, time
end = time.time() + float(sys.argv[1])
with open(sys.argv[2], "a") as f:
    while time.time() < end:
        f.write(repr(time.time()) + " ")
        f.flush()
        time.sleep(0.01)
"""
TICKER = "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', sys.argv[3], *sys.argv[1:3]]))"
# a notebook that asks for quiet after a while, holds it, and records when it held it (or dies inside it)
ASKER = r"""
import sys, time, os
from earlyexit.quiet import quiet
time.sleep(0.4)
with quiet("a test measurement"):
    t0 = time.time()
    if sys.argv[2] == "die":
        os._exit(3)
    time.sleep(0.5)
    t1 = time.time()
with quiet("a second one at once"):       # a block right after another (the runner may not have seen the first end)
    t2 = time.time()
    time.sleep(0.5)
    t3 = time.time()
open(sys.argv[1], "w").write(f"{t0} {t1} {t2} {t3}")
"""


@pytest.fixture
def gen(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(paths, "GENERATED", tmp_path / "generated")
    return tmp_path


def _ticks(path):
    return [float(x) for x in path.read_text().split()]


def test_quiet_pauses_the_notebook_beside_and_its_kernel_then_resumes_it(gen, capsys):
    ticks, held = gen / "ticks", gen / "held"
    cmd = {"ticker": [sys.executable, "-c", TICKER, "2.5", str(ticks), GRAND],
           "asker": [sys.executable, "-c", ASKER, str(held), "hold"]}
    assert jobs.run_jobs(["ticker", "asker"], set(), 2, cmd.__getitem__) == 0
    t0, t1, t2, t3 = map(float, held.read_text().split())
    ts = _ticks(ticks)
    for a, b in ((t0, t1), (t2, t3)):
        assert not [t for t in ts if a + 0.05 < t < b - 0.05], "the kernel beside did not tick while quiet was held"
    assert any(t < t0 for t in ts) and any(t > t3 for t in ts), "it ran before and after the quiet blocks"
    out = capsys.readouterr().out
    assert "asker: quiet for a test measurement; paused ticker" in out
    assert "resumed ticker" in out
    left = [f.name for f in (gen / "generated" / ".quiet").iterdir() if f.name != quiet.PAUSES]
    assert not left, "no request or grant is left behind"


# a notebook beside that reads the conductor's count of pauses across the asker's first block, then after both
COUNTER = r"""
import sys, time
from earlyexit.quiet import pauses
a = pauses(); time.sleep(1.5); b = pauses()
time.sleep(3.0)
c = pauses(); time.sleep(0.3); d = pauses()
open(sys.argv[1], "w").write(f"{a} {b} {c} {d}")
"""


def test_a_notebook_paused_beside_a_quiet_block_can_tell_that_it_was(gen):
    """A timing that spans another notebook's quiet block holds the pause; the count of pauses tells it so (the
    timing then takes its round again), and a stretch with no block beside reads one count before and after."""
    held, seen = gen / "held", gen / "seen"
    cmd = {"counter": [sys.executable, "-c", COUNTER, str(seen)],
           "asker": [sys.executable, "-c", ASKER, str(held), "hold"]}
    assert jobs.run_jobs(["counter", "asker"], set(), 2, cmd.__getitem__) == 0
    a, b, c, d = map(int, seen.read_text().split())
    assert a == 0 and b > a, "the sleep that spanned a pause saw the count move"
    assert c == d >= 4, "two blocks: each a pause and a resume; none after them"


def test_a_holder_that_dies_inside_its_block_gives_the_machine_back(gen, capsys):
    ticks, held = gen / "ticks", gen / "held"
    cmd = {"ticker": [sys.executable, "-c", TICKER, "1.5", str(ticks), GRAND],
           "asker": [sys.executable, "-c", ASKER, str(held), "die"]}
    assert jobs.run_jobs(["ticker", "asker"], set(), 2, cmd.__getitem__) == 1     # the asker failed
    assert not held.exists()
    assert max(_ticks(ticks)) > min(_ticks(ticks)) + 1.0, "the ticker ran on to its end after being resumed"


def test_without_the_runner_quiet_does_nothing_and_nests(monkeypatch, tmp_path):
    monkeypatch.delenv(quiet.ENV_DIR, raising=False)
    with quiet.quiet("outer"):
        with quiet.quiet("inner"):
            pass
    assert not list(tmp_path.iterdir())
    # under a runner that has gone away, a request is not waited on for ever
    monkeypatch.setenv(quiet.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(quiet.ENV_RUNNER, "999999999")
    with quiet.quiet("orphan"):
        assert len(list(tmp_path.glob(f"{__import__('os').getpid()}-*.request"))) == 1
    assert not list(tmp_path.iterdir()), "its request is removed when the block ends"


def test_the_notebooks_a_runner_starts_keep_claims_through_a_pause(gen):
    seen = gen / "env"
    probe = ("import os, sys; open(sys.argv[1], 'w').write(os.environ.get('EARLYEXIT_CLAIM_STALE_S', '') + ' ' + "
             "os.environ.get('EARLYEXIT_QUIET_DIR', ''))")
    assert jobs.run_jobs(["probe"], set(), 2, lambda n: [sys.executable, "-c", probe, str(seen)]) == 0
    stale, folder = seen.read_text().split()
    assert float(stale) >= 3600, "a claim's heartbeat limit outlasts any quiet block it may be paused through"
    assert folder.endswith(".quiet")

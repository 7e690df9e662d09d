"""Quiet: a measurement that needs the machine to itself pauses the notebooks executing beside it.

The cpu profile executes two 1-thread notebooks at once, one a core. A paired ratio at batch 1 holds beside
another chapter (the method and full depth alternate within seconds, so both meet the same neighbour); two kinds
of measurement do not:

* an absolute unit cost (the cost model's layer, head and step times): it is timed once and every prediction of
  every chapter reads it, so a neighbour that starts training during it shifts the whole model (two timing runs
  of one commit put the per-step overhead at 0.6 and 15.2 ms, and the model's median error at 9% and 32%);
* a batched decode, which reads the weights once for many rows and contends with the other core for memory
  bandwidth (its per-round ratios spread 10-30% beside a chapter, against about 1% at batch 1).

Such a measurement runs inside ``with quiet("what it is"):``. Under the book's runner (which sets
:data:`ENV_DIR` for the notebooks it starts) the block waits until the runner has suspended every other
notebook (their processes and kernels, SIGSTOP) and resumes them when it ends; one quiet block runs at a time
and no notebook starts meanwhile. Anywhere else (a notebook run alone, in Jupyter, a test) nothing runs beside,
and ``quiet`` does nothing. Blocks nest (the outer one holds the machine).

Protocol, through files in the runner's folder: the block writes ``<pid>-<n>.request`` (its reason inside; ``n``
counts the process's blocks) and waits for ``<pid>-<n>.granted``; it removes both when it ends. :class:`Conductor` (the runner's side) grants the oldest
request when none is held, and takes a grant back when its files are gone or its process has ended.

A notebook paused in the middle of a timed decode would read its 40 s of pause as decoding time (run B of
3042f20 had rounds at 0.01x and 15.6x beside rounds at 1.0x, and two such rounds of three move a prompt's median).
So the conductor counts every pause and every resume in the file :data:`PAUSES` of that folder, before it
suspends and before it resumes, and :func:`pauses` reads the count: a timing that reads another count after
than before may have been suspended, and is taken again (:func:`earlyexit.experiments.timing.unpaused`).
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path

ENV_DIR = "EARLYEXIT_QUIET_DIR"        # set by the runner for the notebooks it starts
ENV_RUNNER = "EARLYEXIT_QUIET_RUNNER"  # the runner's pid: a block stops waiting if the runner has gone
POLL_S = 0.05
PAUSES = "pauses"                      # the conductor's count of pauses and resumes, in ENV_DIR
_depth = 0
_blocks = 0      # this process's quiet blocks so far: each block's files have a name of their own


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid(name: str) -> int:
    return int(name.split("-", 1)[0])


@contextmanager
def quiet(what: str):
    """Run the block with no other notebook of the build executing (see the module docstring); ``what`` names
    the measurement in the runner's log."""
    global _depth, _blocks
    folder = os.environ.get(ENV_DIR)
    if _depth or not folder or not Path(folder).is_dir():
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    pid = os.getpid()
    _blocks += 1
    # a name of its own for each block: a block that follows another at once must not pass for it
    request, granted = Path(folder) / f"{pid}-{_blocks}.request", Path(folder) / f"{pid}-{_blocks}.granted"
    runner = int(os.environ.get(ENV_RUNNER, "0") or 0)
    request.write_text(what)
    _depth += 1
    try:
        while not granted.exists():
            if runner and not _alive(runner):      # nobody left to grant it: nothing runs beside either
                break
            time.sleep(POLL_S)
        yield
    finally:
        _depth -= 1
        request.unlink(missing_ok=True)
        granted.unlink(missing_ok=True)


def pauses() -> int:
    """How many times the runner has paused or resumed the notebooks beside a quiet block so far (0 outside the
    runner). Read it before and after a timing: a different count means the timing may contain a pause."""
    folder = os.environ.get(ENV_DIR)
    if not folder:
        return 0
    try:
        return int((Path(folder) / PAUSES).read_text() or 0)
    except (OSError, ValueError):
        return -1                      # unreadable now: differs from a good reading, so the timing is retaken


class Conductor:
    """The runner's side: call :meth:`poll` in the loop that watches the notebooks ({name: Popen} of those
    running); it grants a pending request by suspending the other notebooks' process trees, and resumes them
    when the request ends. :meth:`close` resumes everything (call it when the loop ends, error or not)."""

    def __init__(self, folder: Path, log=print):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        for f in self.folder.glob("*.*"):          # a previous run's leftovers
            f.unlink(missing_ok=True)
        self.log = log
        self.held: str | None = None               # the granted request's name, "<pid>-<n>"
        self.holder = ""                           # the notebook it belongs to
        self.paused: list = []                     # psutil.Process objects suspended for it
        self.since = 0.0
        self.edges = -1                            # pauses and resumes so far (the PAUSES file)
        self._tick()                               # 0

    def _tick(self) -> None:
        """Count a pause or a resume (written whole: a reader sees the old count or the new one)."""
        self.edges += 1
        tmp = self.folder / f"{PAUSES}.tmp"
        tmp.write_text(str(self.edges))
        tmp.replace(self.folder / PAUSES)

    def env(self) -> dict:
        """The variables a notebook started by the runner needs to ask for quiet."""
        return {ENV_DIR: str(self.folder), ENV_RUNNER: str(os.getpid())}

    @property
    def busy(self) -> bool:
        """A quiet block is held: start no notebook now."""
        return self.held is not None

    @staticmethod
    def _tree(proc) -> list:
        import psutil
        try:
            p = psutil.Process(proc.pid)
            return [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _owner(self, pid: int, running: dict) -> str | None:
        for name, proc in running.items():
            if any(p.pid == pid for p in self._tree(proc)):
                return name
        return None

    def _resume(self) -> None:
        import psutil
        if self.paused:
            self._tick()                           # before the paused notebooks can read anything
        for p in self.paused:
            try:
                p.resume()
            except psutil.NoSuchProcess:
                pass
        self.paused = []

    def poll(self, running: dict) -> None:
        if self.held is not None:
            done = not (self.folder / f"{self.held}.request").exists() or not _alive(_pid(self.held))
            if not done:
                return
            (self.folder / f"{self.held}.granted").unlink(missing_ok=True)
            names = sorted({n for n in running if n != self.holder})
            self._resume()
            self.log(f"{self.holder}: quiet block ended after {time.perf_counter() - self.since:.0f} s"
                     + (f"; resumed {', '.join(names)}" if names else ""))
            self.held = None
        requests = sorted(self.folder.glob("*.request"), key=lambda f: f.stat().st_mtime)
        for req in requests:
            pid = _pid(req.stem)
            if not _alive(pid):
                req.unlink(missing_ok=True)
                continue
            owner = self._owner(pid, running)
            others = [n for n in running if n != owner]
            if others:
                self._tick()                       # before any of them stops: a timing under way will see it
            for n in others:
                for p in self._tree(running[n]):
                    try:
                        p.suspend()
                        self.paused.append(p)
                    except Exception:          # it ended meanwhile
                        pass
            self.held, self.holder, self.since = req.stem, owner or f"pid {pid}", time.perf_counter()
            what = req.read_text(errors="replace").strip() if req.exists() else ""
            (self.folder / f"{req.stem}.granted").write_text("")
            self.log(f"{self.holder}: quiet for {what or 'a measurement'}"
                     + (f"; paused {', '.join(others)}" if others else ""))
            return

    def close(self) -> None:
        self._resume()
        self.held = None

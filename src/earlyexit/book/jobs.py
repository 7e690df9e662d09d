"""Several notebooks at once: which may run side by side, in what order they start, and the loop that runs them.

A notebook that takes every core (its ``threads`` is not 1) and the front page (it reads what the chapters
computed) run alone; the others run up to ``jobs`` at once, one core each. :func:`run_jobs` runs any list of
commands under these rules, each in a child process with its output in ``book/generated/.logs/<name>.log``;
:mod:`earlyexit.book.runner` gives it one ``python -m earlyexit book --only NAME`` per out-of-date notebook.
A measurement that needs the machine to itself pauses the others meanwhile (:mod:`earlyexit.quiet`).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

from .. import paths
from ..quiet import Conductor

PAUSED_CLAIM_STALE_S = 6 * 3600   # EARLYEXIT_CLAIM_STALE_S for the notebooks run_jobs starts (store.claims: 120)


def runs_alone(name: str, parameters: dict, root: str | None) -> bool:
    """Whether ``name`` must run with no other notebook beside it: the front page (it reads what the chapters
    computed) and any notebook whose ``threads`` is not 1 (it takes every core: a second process beside it would
    leave its threads waiting for a busy core)."""
    return name == root or parameters.get("threads", "auto") != 1


def job_order(selected: list[str], alone: set[str], root: str | None, first=()) -> list[str]:
    """The order notebooks start in when several run at once: those that run alone first (chapter 6's training,
    which later chapters read, is one), then those of ``first`` (the profile's longest, so that the short ones
    fill the end: two chapters of very different length started last leave one core idle), then the others in
    book order, the front page last."""
    solo = [n for n in selected if n in alone and n != root]
    lead = [n for n in first if n in selected and n not in alone and n != root]
    rest = [n for n in selected if n not in alone and n != root and n not in lead]
    return solo + lead + rest + ([root] if root in selected else [])


def may_start(name: str, running, jobs: int, alone: set[str]) -> bool:
    """Whether ``name`` may start while the notebooks ``running`` run, with at most ``jobs`` at once."""
    if not running:
        return True
    return len(running) < jobs and name not in alone and not any(r in alone for r in running)


def time_left(pending, running: dict, last: dict, jobs: int) -> tuple[float, int]:
    """Seconds the build has left by the last build's times ``last`` ({name: seconds}): what the ``pending``
    notebooks took then, plus what the ``running`` ones ({name: seconds so far}) have left of theirs, shared out
    over ``jobs`` at once; and how many of them have no time of their own (never built before), left out."""
    known = [last[n] for n in pending if last.get(n)]
    known += [max(last[n] - s, 0.0) for n, s in running.items() if last.get(n)]
    unknown = sum(1 for n in [*pending, *running] if not last.get(n))
    return sum(known) / max(1, jobs), unknown


def progress_line(n_done: int, total: int, name: str, took: float, so_far: float, left: tuple | None) -> str:
    """``[3/11] 07_x: done in 120 s; 300 s so far, about 240 s left (by the last build's times)``; the estimate
    says when some notebooks have no time from a last build, and is left out when there is nothing left."""
    line = f"[{n_done}/{total}] {name}: done in {took:.0f} s; {so_far:.0f} s so far"
    if left is None or n_done == total:
        return line
    s, unknown = left
    if not s and unknown:
        return line + f"; no estimate ({unknown} notebook{'s' if unknown > 1 else ''} never built before)"
    line += f", about {s:.0f} s left by the last build's times"
    if unknown:
        line += f" (and {unknown} notebook{'s' if unknown > 1 else ''} never built before)"
    return line


def run_jobs(order: list[str], alone: set[str], jobs: int, command, env: dict | None = None,
             label: str = "", last: dict | None = None) -> int:
    """Run ``command(name)`` (an argv) for each name of ``order`` in a child process, up to ``jobs`` at once,
    starting them in that order as :func:`may_start` allows; each child's output goes to
    book/generated/.logs/NAME.log. A child that asks for the machine to itself (:func:`earlyexit.quiet.quiet`)
    gets it: the others are paused until its block ends, and none starts meanwhile. After each one, a line with
    the time so far and the time left by ``last`` ({name: seconds the last build took}). A failure lets the
    running ones finish, starts no other, and prints the failed one's log tail. Returns 0, or 1 after a
    failure."""
    pending = list(order)
    t_start = time.perf_counter()
    logs = paths.GENERATED / ".logs"
    logs.mkdir(parents=True, exist_ok=True)
    conductor = Conductor(paths.GENERATED / ".quiet", log=lambda line: print(line, flush=True))
    env = {**(os.environ if env is None else env), **conductor.env()}
    # a notebook paused for another's quiet block cannot beat its claims' heartbeats: on one machine a dead
    # claimant is seen at once (its pid), so the heartbeat limit only has to outlast the longest pause
    env.setdefault("EARLYEXIT_CLAIM_STALE_S", str(PAUSED_CLAIM_STALE_S))
    running: dict[str, tuple] = {}
    failed: list[str] = []
    n_done = 0
    try:
        while pending or running:
            n_done = _step(pending, running, failed, n_done, jobs, alone, command, env, label, last, logs,
                           conductor, order, t_start)
            if n_done < 0:
                break
    finally:
        conductor.close()
    if failed and pending:
        print(f"not started after the failure: {', '.join(pending)}", file=sys.stderr)
    return 1 if failed else 0


def _step(pending, running, failed, n_done, jobs, alone, command, env, label, last, logs, conductor, order,
          t_start) -> int:
    """One pass of :func:`run_jobs`' loop: start what may start, grant or end a quiet block, collect what ended.
    Returns the count of notebooks done, or -1 when nothing is left to wait for."""
    while pending and not failed and not conductor.busy and may_start(pending[0], running, jobs, alone):
        name = pending.pop(0)
        log = open(logs / f"{name}.log", "w")
        proc = subprocess.Popen(command(name), stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=paths.REPO_ROOT)
        running[name] = (proc, log, time.perf_counter())
        beside = ", ".join(r for r in running if r != name)
        print(f"{name}: executing{label}" + (f" (beside {beside})" if beside else ""), flush=True)
    if not running:
        return -1
    time.sleep(0.2)
    conductor.poll({n: v[0] for n, v in running.items()})
    for name, (proc, log, t0) in list(running.items()):
        if proc.poll() is None:
            continue
        log.close()
        del running[name]
        n_done += 1
        if proc.returncode == 0:
            now = time.perf_counter()
            left = time_left(pending, {r: now - v[2] for r, v in running.items()}, last, jobs) if last else None
            print(progress_line(n_done, len(order), name, now - t0, now - t_start, left), flush=True)
        else:
            failed.append(name)
            tail = (logs / f"{name}.log").read_text(errors="replace").strip().splitlines()[-15:]
            print(f"error: {name} failed (exit code {proc.returncode}); log "
                  f"{paths.relative(logs / f'{name}.log')}, last lines:\n  " + "\n  ".join(tail), file=sys.stderr)
    return n_done

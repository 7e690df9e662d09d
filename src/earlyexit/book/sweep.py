"""Fill the result store with N workers: ``python -m earlyexit sweep``.

    python -m earlyexit sweep --profile cpu --workers 2                      # two local processes
    python -m earlyexit sweep --profile smoke --only 02_naive_collapse --workers 2
    torchrun --nproc_per_node 4 -m earlyexit sweep --profile gpu             # one rank a GPU

Each worker executes the selected notebooks with papermill exactly as the book does (same parameters, same
code), into a temporary folder that is deleted afterwards (executed copies and figures included): the point
is the result store, which every worker shares. The library's sweep loops shard their points by rank
(:mod:`earlyexit.store.workers`) and the store's claims keep two workers from computing one point
(:mod:`earlyexit.store.claims`). Afterwards ``python -m earlyexit book --profile P`` reads every point.

Ranks: the launcher (``--workers N``) starts N processes with ``EARLYEXIT_RANK=i`` and ``EARLYEXIT_WORLD=N``;
under torchrun each process is one worker, its rank and world size from torchrun's ``RANK`` and
``WORLD_SIZE``. On CUDA a worker sees one GPU, the ``LOCAL_RANK``-th visible one (``CUDA_VISIBLE_DEVICES``).
Checkpoints that the selected notebooks load (chapter 6's) are built first, one worker per checkpoint.

Timings measured while other workers share the cores are distorted: on CPU the command refuses more workers
than the cores this process may use, unless ``--force``; timings meant for publication are best recomputed
by one process alone.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from ..store import claims
from .. import paths
from . import runner
from ..store import workers

WORKER_FLAG = "EARLYEXIT_SWEEP_WORKER"  # set by the launcher in the processes it starts
USES_CHECKPOINTS = re.compile(r"\b(?:checkpoints\.(?:ensure|load)|load_trained)\(")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m earlyexit sweep",
        description="Compute the sweep points of the selected notebooks with N workers that share the result "
                    "store; the book then reads them. Also runs under torchrun (one worker a rank).")
    p.add_argument("--profile", default="cpu", help="profiles/<name>.yml (default cpu)")
    p.add_argument("--only", nargs="+", metavar="NAME", default=None,
                   help="only these notebooks (names as in _toc.yml, e.g. 02_naive_collapse)")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes to start (default 1; under torchrun: its world size)")
    p.add_argument("--force", action="store_true",
                   help="allow more CPU workers than cores (their timings are then even less meaningful)")
    return p


def cpu_count() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def visible_gpus() -> list[str]:
    """The CUDA devices this process sees, as CUDA_VISIBLE_DEVICES items."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    listed = [d.strip() for d in env.split(",") if d.strip()] if env else []
    return listed[:n] if listed else [str(i) for i in range(n)]


def torchrun_env(env=None) -> tuple[int, int, int, int] | None:
    """(rank, world, local rank, local world) when started by torchrun, else None."""
    env = os.environ if env is None else env
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return None
    try:
        rank, world, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
    except ValueError:
        raise runner.UsageError("torchrun's RANK, WORLD_SIZE, LOCAL_RANK must be integers; got "
                                + ", ".join(f"{k}={env.get(k)!r}" for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")))
    return rank, world, local, local_world


def _devices(profile, selected) -> set[str]:
    return {profile.parameters(n)["device"] for n in selected}


def _on_cuda(profile, selected) -> bool:
    devices = _devices(profile, selected)
    if "cuda" in devices:
        return True
    if "auto" in devices:
        import torch

        return torch.cuda.is_available()
    return False


def check(args, profile, selected, n_local: int) -> None:
    """Refuse what cannot work, before any work: raise UsageError. ``n_local``: workers on this machine
    that share its GPUs (or cores)."""
    if _on_cuda(profile, selected):
        gpus = visible_gpus()
        if not gpus:
            raise runner.UsageError(f"profile {profile.name!r} runs on cuda, but no CUDA GPU is visible here "
                                    f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        if n_local > len(gpus):
            raise runner.UsageError(f"{n_local} workers on this machine but {len(gpus)} GPU(s) visible "
                                    f"({', '.join(gpus)}): use one worker per GPU (--workers {len(gpus)})")
    elif n_local > cpu_count() and not args.force:
        raise runner.UsageError(
            f"{n_local} CPU workers on this machine but only {cpu_count()} core(s) available to it: workers that "
            f"share cores slow each other down and distort every timing; use --workers {cpu_count()} or fewer, "
            f"or --force")


def pin_gpu(local_rank: int, local_world: int, profile, selected) -> bool:
    """Under torchrun: let this rank see only the ``local_rank``-th GPU (set before torch starts CUDA here,
    and inherited by the notebooks' kernels). True if pinned (the profile may run on a GPU)."""
    if not _devices(profile, selected) & {"cuda", "auto"}:
        return False
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    listed = [d.strip() for d in env.split(",") if d.strip()] if env else [str(i) for i in range(local_world)]
    if local_rank >= len(listed):
        raise runner.UsageError(f"rank {local_rank} on this machine but CUDA_VISIBLE_DEVICES={env!r} lists "
                                f"{len(listed)} GPU(s): start one rank per GPU")
    os.environ["CUDA_VISIBLE_DEVICES"] = listed[local_rank]
    return True


def plan(args):
    """(profile, selected notebooks) after checking the command line and the profile; UsageError if wrong."""
    if args.workers is not None and args.workers < 1:
        raise runner.UsageError(f"--workers must be a positive number of processes, got {args.workers}")
    ns = argparse.Namespace(profile=args.profile, only=args.only)
    profile, _names, selected = runner._plan(ns)
    return profile, selected


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        profile, selected = plan(args)
        tr = torchrun_env()
        if os.environ.get(WORKER_FLAG) == "1":
            rank, world = workers.rank_world()
            return work(profile, selected, rank, world)
        if tr is not None:
            rank, world, local, local_world = tr
            if args.workers not in (None, world):
                raise runner.UsageError(f"--workers {args.workers} but torchrun started {world} ranks: drop "
                                        f"--workers under torchrun (its --nproc_per_node sets the count)")
            pinned = pin_gpu(local, local_world, profile, selected)
            check(args, profile, selected, 1 if pinned and _on_cuda(profile, selected) else local_world)
            return work(profile, selected, rank, world)
        n = args.workers or 1
        check(args, profile, selected, n)
    except (runner.UsageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return launch(argv if argv is not None else sys.argv[1:], n, profile, selected)


def launch(argv: list[str], n: int, profile, selected) -> int:
    """Start ``n`` workers running this command and wait for all; 0 if every one succeeded."""
    gpus = visible_gpus() if _on_cuda(profile, selected) else []
    t0 = time.perf_counter()
    print(f"sweep: {n} worker(s), profile {profile.name}, notebooks {', '.join(selected)}", flush=True)
    procs = []
    for i in range(n):
        env = {**os.environ, WORKER_FLAG: "1", workers.RANK: str(i), workers.WORLD: str(n)}
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[i]
        procs.append(subprocess.Popen([sys.executable, "-m", "earlyexit", "sweep", *argv], env=env))
    codes: dict[int, int] = {}
    try:
        while len(codes) < n:
            for i, p in enumerate(procs):
                if i not in codes and p.poll() is not None:  # reaped at once: a killed worker is no zombie
                    codes[i] = p.returncode
            time.sleep(0.2)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait()
        raise
    failed = {i: c for i, c in codes.items() if c != 0}
    for i, c in failed.items():
        how = f"was killed by {signal.Signals(-c).name}" if c < 0 else f"exited with code {c}"
        print(f"error: worker {i} {how}; the points it finished are stored, rerun the same command to complete "
              f"the rest", file=sys.stderr)
    if not failed:
        print(f"sweep done in {time.perf_counter() - t0:.0f} s with {n} worker(s); the book now reads these points: "
              f"python -m earlyexit book --profile {profile.name}", flush=True)
        if n > 1:
            print("note: timings measured while workers shared the machine are distorted; recompute those "
                  "meant for publication alone (see README, 'More than one machine')", flush=True)
    return 1 if failed else 0


@contextmanager
def _scratch_outputs(rank: int):
    """Executed notebooks and figures go to a temporary folder (kept, and named, if a notebook fails)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"earlyexit-sweep-rank{rank}-"))
    saved = paths.GENERATED, os.environ.get("EARLYEXIT_FIGURES")
    paths.GENERATED = tmp / "generated"
    os.environ["EARLYEXIT_FIGURES"] = str(tmp / "figures")
    ok = False
    try:
        yield tmp
        ok = True
    finally:
        paths.GENERATED = saved[0]
        if saved[1] is None:
            os.environ.pop("EARLYEXIT_FIGURES", None)
        else:
            os.environ["EARLYEXIT_FIGURES"] = saved[1]
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)


def work(profile, selected, rank: int, world: int) -> int:
    """One worker: build the checkpoints the notebooks load, then execute every selected notebook."""
    os.environ[workers.RANK], os.environ[workers.WORLD] = str(rank), str(world)  # the kernels inherit them
    head = f"[worker {rank}/{world}]"
    t_all = time.perf_counter()
    try:
        build_checkpoints(profile, selected, head)
    except Exception as e:
        print(f"error: {head} building the checkpoints failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    with _scratch_outputs(rank) as tmp:
        for name in selected:
            t0 = time.perf_counter()
            try:
                runner.execute(name, dict(profile.parameters(name)), timeout_s=profile.timeout_s, progress=False)
            except runner.NotebookFailed as e:
                print(f"error: {head} {e} (outputs kept in {tmp})", file=sys.stderr)
                return 1
            print(f"{head} {name}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"{head} finished in {time.perf_counter() - t_all:.0f} s", flush=True)
    return 0


def needs_checkpoints(selected) -> bool:
    """Whether a selected notebook loads or builds chapter 6's checkpoints."""
    return any(USES_CHECKPOINTS.search(runner.source_path(n).read_text()) for n in selected)


def build_checkpoints(profile, selected, head: str) -> None:
    """Chapter 6's checkpoints under ``profile``, each built by one worker (the others wait for it), so that
    no two workers train the same checkpoint."""
    if not needs_checkpoints(selected) or "06_training" not in runner.params_mod.SCHEMAS:
        return
    from ..engine.threads import set_threads
    from ..training import checkpoints
    from ..experiments.trained import recipes

    p = profile.parameters("06_training")
    todo = list(recipes(p).values())
    if all(checkpoints.is_complete(r) for r in todo):
        return
    set_threads(p.get("threads", 0))

    def build(recipe):
        d = recipe.directory()
        held = claims.acquire(d.with_name(d.name + ".claim"), f"checkpoint {recipe.label()}",
                              lambda: checkpoints.is_complete(recipe))
        if held is not None:
            with held:
                if not checkpoints.is_complete(recipe):
                    print(f"{head} training {d.name}", flush=True)
                    checkpoints.ensure(recipe, device=p["device"], progress=False)

    workers.each(todo, build)

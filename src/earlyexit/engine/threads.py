"""CPU threads: how many cores this process may use, how busy they are, and the torch thread count a chapter asks for.

    n, why = resolve_threads("auto")      # the cores available to this process, and why that many
    set_threads(n)
"""
from __future__ import annotations

import torch


def available_cores() -> int:
    """The cores this process may use: its CPU affinity (``os.sched_getaffinity``), capped by a cgroup CPU
    quota (containers, batch jobs: ``/sys/fs/cgroup/cpu.max``) and by a scheduler's grant (``SLURM_CPUS_PER_TASK``)."""
    import math
    import os

    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        n = min(n, int(slurm))
    return max(1, n)


def _cpu_jiffies(stat: str, cpus) -> tuple[int, int]:
    """(busy, total) jiffies of the CPUs ``cpus`` in a /proc/stat text."""
    busy = total = 0
    for line in stat.splitlines():
        name, *f = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        v = [int(x) for x in f[:8]]
        idle = v[3] + v[4]                                   # idle + iowait
        total += sum(v)
        busy += sum(v) - idle
    return busy, total


def busy_cores(window: float = 0.3, read=None) -> float:
    """How many of this process's cores other work keeps busy: the CPUs of its affinity sampled over
    ``window`` seconds in /proc/stat, less this process's own CPU time in that window. 0.0 where /proc/stat
    cannot be read. ``read`` (for tests) returns the /proc/stat text."""
    import os
    import time

    def default():
        with open("/proc/stat") as f:
            return f.read()

    read = read or default
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        cpus = set(range(os.cpu_count() or 1))
    try:
        b0, t0 = _cpu_jiffies(read(), cpus)
        own0 = time.process_time()
        time.sleep(window)
        b1, t1 = _cpu_jiffies(read(), cpus)
        own = time.process_time() - own0
    except (OSError, ValueError, IndexError):
        return 0.0
    if t1 <= t0:
        return 0.0
    frac = (b1 - b0) / (t1 - t0)                              # busy share of all sampled CPUs
    return max(0.0, frac * len(cpus) - own / window)


def resolve_threads(spec) -> tuple[int, str]:
    """The thread count a ``threads`` parameter asks for, and why: an integer >= 1 is taken as given; 0 leaves
    torch's default; ``"auto"`` takes the cores available to this process (:func:`available_cores`), less the
    cores other processes keep busy right now (:func:`busy_cores`: a thread that waits for a busy core makes
    every parallel operation wait for it; on a 2-core machine next to one busy process two threads decoded 20x
    slower than one), shared evenly among the processes of this node that decode or train together (torchrun's
    ``LOCAL_WORLD_SIZE``, or the ``sweep`` command's ``EARLYEXIT_WORLD``, whose load is not counted as other
    work). ``EARLYEXIT_IGNORE_LOAD=1`` leaves the load out. Anything else raises ValueError naming what is valid."""
    import os

    if isinstance(spec, str) and spec.strip().lower() == "auto":
        cores = available_cores()
        share = 1
        for var in ("LOCAL_WORLD_SIZE", "EARLYEXIT_WORLD"):
            v = os.environ.get(var, "")
            if v.isdigit() and int(v) > 1:
                share = int(v)
                break
        why = f"auto: {cores} cores available"
        free = cores
        if share == 1 and cores > 1 and os.environ.get("EARLYEXIT_IGNORE_LOAD", "") != "1":
            busy = busy_cores()
            taken = min(cores - 1, int(busy + 0.5))
            if taken:
                free = cores - taken
                why += f", {busy:.1f} kept busy by other processes"
        n = max(1, free // share)
        return n, why + (f", shared by {share} processes" if share > 1 else "")
    if isinstance(spec, bool) or not isinstance(spec, int) or spec < 0:
        raise ValueError(f"threads must be 'auto', 0 (torch's default) or a positive integer, got {spec!r}")
    if spec == 0:
        return torch.get_num_threads(), "torch's default"
    return spec, "given"


def set_threads(n) -> int:
    """Use ``n`` CPU threads for torch (``"auto"``, 0 for torch's default, or a count; see
    :func:`resolve_threads`). Returns the number in use.

    Measured on a shared 2-core machine: with other processes running, one thread decodes up to
    six times faster than two (the second thread spins waiting for a core it does not get).
    """
    k, _ = resolve_threads(n)
    if k != torch.get_num_threads():
        torch.set_num_threads(k)
    return torch.get_num_threads()

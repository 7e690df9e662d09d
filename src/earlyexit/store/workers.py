"""Sharding sweeps over SPMD workers that share one result store (``python -m earlyexit sweep``).

    rank, world = workers.rank_world()      # (0, 1) in an ordinary process
    mine = workers.my_share(configs)        # items whose index is rank modulo world
    tables = workers.each(configs, fn)      # fn(item) for every item, in order; the worker's share first

Every worker runs the same notebook code. Inside a worker (``EARLYEXIT_RANK=i``, ``EARLYEXIT_WORLD=N`` in the
environment), a sweep loop first computes its own share of the points (index ≡ rank mod world), then walks
all points in order: points finished by other workers are read from the result store, points another worker
is computing are waited for, and points nobody has started yet are claimed and computed (work stealing; see
:mod:`earlyexit.store.claims`). So every worker ends with the whole table, and a rerun of the notebook alone
reads every point from the store. With one worker (the default) :func:`each` is a plain loop.

Only the library's loops are sharded (:func:`earlyexit.experiments.points.sweep`, which the comparison chapter's
:func:`~earlyexit.experiments.compare.method_points` uses, :func:`earlyexit.store.results.sweep` and
:func:`earlyexit.experiments.drift.drift_point`); a notebook's own single points are computed by whichever worker
gets there first, and the others wait for it.
"""
from __future__ import annotations

import os
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")
R = TypeVar("R")
RANK, WORLD = "EARLYEXIT_RANK", "EARLYEXIT_WORLD"


def _int_env(name: str, env) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def rank_world(env=None) -> tuple[int, int]:
    """(rank, world size) of this worker from ``EARLYEXIT_RANK`` / ``EARLYEXIT_WORLD``; (0, 1) when unset."""
    env = os.environ if env is None else env
    rank, world = _int_env(RANK, env), _int_env(WORLD, env)
    if rank is None and world is None:
        return 0, 1
    if rank is None or world is None:
        raise ValueError(f"set both {RANK} and {WORLD} (got {RANK}={env.get(RANK)!r}, {WORLD}={env.get(WORLD)!r})")
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"need {WORLD} >= 1 and 0 <= {RANK} < {WORLD}; got rank {rank}, world {world}")
    return rank, world


def my_share(items: Iterable[T], rank: int | None = None, world: int | None = None) -> list[T]:
    """The items whose index is ``rank`` modulo ``world`` (all of them in a single process)."""
    if rank is None or world is None:
        rank, world = rank_world()
    return [x for i, x in enumerate(items) if i % world == rank]


def each(items: Iterable[T], fn: Callable[[T], R]) -> list[R]:
    """``[fn(x) for x in items]``; in a worker of several, ``fn`` first runs on the worker's share (for its
    side effect: the result store fills), then on every item in order (reading what others computed,
    computing what nobody has yet). ``fn`` must therefore be cached (a store lookup when repeated)."""
    items = list(items)
    rank, world = rank_world()
    if world > 1:
        for x in my_share(items, rank, world):
            fn(x)
    return [fn(x) for x in items]

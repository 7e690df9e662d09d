"""A result cache for sweeps: each point is computed once, kept on disk, and checked when read.

    from earlyexit import store
    df = store.cached("exit_rate", {"rule": "margin", "threshold": 0.9}, compute, model=lm)
    table = store.sweep("exit_rate", [{"threshold": t} for t in (0.5, 0.7, 0.9)], point, model=lm)

An entry's key hashes the experiment name, its parameters, the model's weights (SHA-256) and the
version of the code it depends on (:mod:`earlyexit.store.codekey`: the modules of the package that the
computation's code imports, transitively), so changing any of them computes afresh, and editing code the
computation cannot reach (the book's build tooling, a notebook's prose, a test) recomputes nothing.

On disk, under ``data/cache/<name>/``, an entry is two files:
``<key>.csv`` (the table, readable by anything) and ``<key>.json`` (parameters, versions, column
dtypes and the SHA-256 of the CSV). Both are written to a temporary name and renamed, the JSON
last: an entry without its JSON, or whose CSV does not match the checksum, is not complete and is
computed again. So a sweep killed at any moment resumes where it stopped, and a corrupted entry
is detected instead of read.

Several processes may share one store (the workers of ``python -m earlyexit sweep``, or two notebooks
run at once). Entries appear whole (the renames above) and are checked when read, so no process ever
takes a half-written one as complete; and a missing entry is computed under a *claim*, a lock file
``<key>.claim`` beside it (:mod:`earlyexit.store.claims`): of several processes that need it at once, one
computes it and the others wait and read it. The claim of a killed process is taken over, so a
killed worker loses only the point it was computing.

A point that runs out of memory (``torch.OutOfMemoryError``, CUDA's included, or ``MemoryError``)
stops the sweep with a :class:`ResourceError` that names the point and what to lower; the points
finished before it stay cached, and nothing of the failed one is written.
"""
from __future__ import annotations

import hashlib
import io
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from . import claims, codekey
from ..files import atomic_write_bytes, canonical
from ..progress import say
from . import workers

FORMAT = 1


def weights_id(model) -> str | None:
    """The weights SHA-256 of a LoadedModel, or a string given directly, or None."""
    if model is None or isinstance(model, str):
        return model
    return getattr(model, "weights_sha256", None) or repr(model)


def entry_key(name: str, params: Mapping, model=None, code: str | None = None) -> str:
    blob = canonical({"format": FORMAT, "name": name, "params": dict(params),
                      "weights_sha256": weights_id(model), "code_version": code or codekey.code_version()})
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _code(*fns) -> tuple[list[str], str]:
    """The modules the running computation depends on (the module that asks the store, and those where ``fns``
    are defined: :func:`earlyexit.store.codekey.roots_for`) and the version of the code they reach; the whole
    package when none is the package's."""
    roots = codekey.roots_for(*fns)
    return roots, codekey.code_version(roots)


def _root(root) -> Path:
    if root is not None:
        return Path(root)
    from .. import paths

    return getattr(paths, "CACHE", paths.DATA / "cache")


def _check_name(name: str) -> None:
    if not name or any(c in name for c in "/\\") or name.startswith("."):
        raise ValueError(f"experiment name must be a plain file stem, got {name!r}")


def _as_frame(result):
    import pandas as pd

    if isinstance(result, pd.DataFrame):
        return result.reset_index(drop=True)
    if isinstance(result, Mapping):
        return pd.DataFrame([result])
    if isinstance(result, (list, tuple)):
        return pd.DataFrame(list(result))
    raise TypeError(f"a cached computation must return a DataFrame, a dict (one row) or a list of "
                    f"dicts; got {type(result).__name__}")


def _encode(df) -> tuple[bytes, dict]:
    if not all(isinstance(c, str) for c in df.columns):
        raise TypeError(f"cached tables need string column names, got {list(df.columns)!r}")
    csv = df.to_csv(index=False, lineterminator="\n").encode()
    return csv, {c: str(t) for c, t in df.dtypes.items()}


def _decode(csv: bytes, columns: list, dtypes: dict):
    import pandas as pd

    if not columns:
        return pd.DataFrame()
    numeric = {c: t for c, t in dtypes.items() if t.startswith(("int", "uint", "float", "bool"))}
    text = [c for c in columns if c not in numeric]
    # pandas 3 parses floats exactly by default (and deprecates the option); pandas 2 needs asking
    exact = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}
    df = pd.read_csv(io.BytesIO(csv), keep_default_na=False, na_values={c: [""] for c in numeric},
                     dtype={c: str for c in text}, **exact)
    for c, t in numeric.items():
        df[c] = df[c].astype(t)
    return df[columns]


class CorruptEntry(Exception):
    pass


class ResourceError(RuntimeError):
    """A cached computation ran out of memory; the message names the point and what to lower."""


DEFAULT_LOWER_HINT = "n_prompts, max_new_tokens or the batch size"
_SIZE_KNOBS = ("n_prompts", "max_new_tokens", "batch_size", "batch", "max_prompt_tokens", "n_tokens",
               "n_steps", "n_samples")


def _oom_types() -> tuple:
    """The out-of-memory exceptions to explain: MemoryError, and torch's if torch is loaded."""
    types = [MemoryError]
    torch = sys.modules.get("torch")
    if torch is not None:
        for t in (getattr(torch, "OutOfMemoryError", None),
                  getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)):
            if isinstance(t, type) and issubclass(t, BaseException) and t not in types:
                types.append(t)
    return tuple(types)


def _oom_message(name: str, params: Mapping, err: BaseException, lower_hint: str | None) -> str:
    shown = canonical(dict(params))
    if len(shown) > 400:
        shown = shown[:400] + "...}"
    knobs = [f"{k}={params[k]!r}" for k in _SIZE_KNOBS if k in params]
    hint = lower_hint or DEFAULT_LOWER_HINT
    if knobs and not lower_hint:
        hint = f"{hint} (this point has {', '.join(knobs)})"
    first = (str(err).strip().splitlines() or [""])[0][:300]
    where = "GPU" if "cuda" in type(err).__module__.lower() or "CUDA" in first else "memory"
    return (f"{name}: ran out of {where} computing the point {shown}; lower {hint}, or run on a "
            f"machine with more memory. Points finished before it are cached, so rerunning resumes "
            f"here. ({type(err).__name__}: {first})")


def _load(csv_path: Path, meta_path: Path, key: str):
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:
        raise CorruptEntry(f"unreadable metadata ({e.__class__.__name__})") from None
    if meta.get("key") != key or meta.get("format") != FORMAT:
        raise CorruptEntry("metadata belongs to another entry")
    try:
        csv = csv_path.read_bytes()
    except OSError:
        raise CorruptEntry("table file missing") from None
    if hashlib.sha256(csv).hexdigest() != meta.get("csv_sha256"):
        raise CorruptEntry("table does not match its SHA-256")
    try:
        return _decode(csv, meta["columns"], meta["dtypes"])
    except Exception as e:  # a checksum-valid file that does not parse is still unusable
        raise CorruptEntry(f"table does not parse ({e.__class__.__name__}: {e})") from None


def _paths(name: str, params: Mapping, model, root, code: str | None = None) -> tuple[str, Path, Path]:
    """The entry's key and files; ``code`` by default the version of the code of whoever asks the store."""
    _check_name(name)
    key = entry_key(name, params, model, code or _code()[1])
    folder = _root(root) / name
    return key, folder / f"{key}.csv", folder / f"{key}.json"


def read(name: str, params: Mapping, *, model=None, root=None):
    """The complete entry for (``name``, ``params``, ``model``), or None if it is missing or incomplete
    (never computes, never deletes; a damaged entry reads as None)."""
    key, csv_path, meta_path = _paths(name, params, model, root)
    if not meta_path.exists():
        return None
    try:
        return _load(csv_path, meta_path, key)
    except CorruptEntry:
        return None


def cached(name: str, params: Mapping, compute_fn: Callable[[], Any], *, model=None, root=None,
           refresh: bool = False, lower_hint: str | None = None, code_of: Callable | None = None):
    """Return the table for (``name``, ``params``, ``model``), computing it with ``compute_fn()`` once.

    ``compute_fn`` returns a DataFrame, a dict (one row) or a list of dicts. The value returned is
    always the table as read back from disk, so a first run and a cached run give equal frames.
    ``refresh=True`` recomputes and overwrites. If ``compute_fn`` runs out of memory, a
    :class:`ResourceError` names the point and suggests lowering ``lower_hint`` (default: the
    prompt count, generation length or batch size); the original error is its ``__cause__``.

    Concurrent processes (see :mod:`earlyexit.store.claims`): a missing entry is computed under a claim
    file ``<key>.claim`` beside it, so that of several processes asking for it at once one computes it
    and the others wait and read it; the claim of a killed process is taken over.

    The key covers the code the computation depends on: the package module that calls this (the innermost one
    outside the store), ``compute_fn``'s and ``code_of``'s, and all they import (:mod:`earlyexit.store.codekey`).
    """
    roots, code = _code(compute_fn, code_of)
    key, csv_path, meta_path = _paths(name, params, model, root, code)
    lock = csv_path.with_suffix(".claim")
    seen_damage = False
    while True:
        if not refresh and meta_path.exists():
            try:
                return _load(csv_path, meta_path, key)
            except CorruptEntry:
                seen_damage = True  # look again under the claim: it may be a write in progress
        # wait for a finished entry unless the one there is damaged (then for the claim, to repair it)
        until = None if refresh or seen_damage else meta_path.exists
        held = claims.acquire(lock, f"{name}/{key}", until, on_wait=say)
        if held is None:
            continue  # it appeared while we waited: read it
        with held:
            if not refresh and meta_path.exists():
                try:
                    return _load(csv_path, meta_path, key)
                except CorruptEntry as e:
                    warnings.warn(f"cache entry {name}/{key} is corrupted ({e}); computing it again",
                                  RuntimeWarning, stacklevel=2)
                    for p in (meta_path, csv_path):
                        p.unlink(missing_ok=True)
            return _compute_and_write(name, params, compute_fn, model, key, csv_path, meta_path, lower_hint,
                                      (roots, code))


def _compute_and_write(name, params, compute_fn, model, key, csv_path: Path, meta_path: Path, lower_hint,
                       code: tuple[list[str], str] | None = None):
    try:
        result = compute_fn()
    except _oom_types() as e:
        raise ResourceError(_oom_message(name, params, e, lower_hint)) from e
    df = _as_frame(result)
    csv, dtypes = _encode(df)
    roots, version = code or ([], codekey.code_version())
    meta = {"format": FORMAT, "key": key, "name": name, "params": json.loads(canonical(dict(params))),
            "weights_sha256": weights_id(model), "code_version": version, "code_roots": roots,
            "columns": list(df.columns), "dtypes": dtypes, "rows": len(df),
            "csv_sha256": hashlib.sha256(csv).hexdigest()}
    atomic_write_bytes(csv_path, csv)
    atomic_write_bytes(meta_path, (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode())
    out = _decode(csv, meta["columns"], dtypes)
    if not _frames_equal(out, df):
        warnings.warn(f"{name}: the table does not survive a CSV round trip exactly (mixed-type or "
                      f"non-scalar columns?); the cached reading is returned", RuntimeWarning, stacklevel=3)
    return out


def has(name: str, params: Mapping, *, model=None, root=None, or_claimed: bool = False) -> bool:
    """Whether an entry for (``name``, ``params``, ``model``) is on disk (it may still fail its checksum); with
    ``or_claimed``, also while a live process computes it (its claim is held), so that a caller choosing
    between two entries waits for the one in progress instead of computing the other."""
    _, csv_path, meta_path = _paths(name, params, model, root)
    return meta_path.exists() or (or_claimed and claims.is_live(csv_path.with_suffix(".claim")))


def _frames_equal(a, b) -> bool:
    import pandas as pd

    try:
        pd.testing.assert_frame_equal(a, b, check_dtype=False, check_exact=True)
        return True
    except AssertionError:
        return False


def progress_enabled() -> bool:
    from ..progress import enabled

    return enabled()


def sweep(name: str, points: Iterable[Mapping], fn: Callable[..., Any], *, model=None,
          desc: str | None = None, root=None, add_params: bool = True, lower_hint: str | None = None):
    """Compute ``fn(**point)`` for each point through :func:`cached` and concatenate the tables.

    With ``add_params`` the point's scalar parameters are prepended as columns (unless the result
    already has them). Points already in the cache are read, not recomputed, so a killed sweep
    resumes where it stopped. Progress goes to stderr (``EARLYEXIT_PROGRESS=0`` silences it).
    A point that runs out of memory stops the sweep with a :class:`ResourceError` naming it and
    what to lower (``lower_hint``); the points before it stay cached. In a worker of a distributed
    sweep the worker's share of the points comes first (:func:`earlyexit.store.workers.each`).
    """
    import pandas as pd
    from tqdm import tqdm

    points = [dict(p) for p in points]
    rank, world = workers.rank_world()
    bar = tqdm(total=len(points) + (len(workers.my_share(points)) if world > 1 else 0), desc=desc or name,
               unit="pt", file=sys.stderr,
               disable=not progress_enabled(), dynamic_ncols=True)

    def one(point):
        df = cached(name, point, lambda: fn(**point), model=model, root=root, lower_hint=lower_hint, code_of=fn)
        bar.update(1)
        return df

    try:
        frames = workers.each(points, one)
    finally:
        bar.close()  # a failing point leaves no dangling progress bar above its message
    for point, df in zip(points, frames):
        if add_params:
            scalars = {k: v for k, v in point.items()
                       if isinstance(v, (bool, int, float, str)) and k not in df.columns}
            for i, (k, v) in enumerate(scalars.items()):
                df.insert(i, k, v)
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)


def entries(name: str, *, model=None, root=None, current_code: bool = True):
    """Every complete entry of experiment ``name`` for ``model`` (its weights' hash) in the store: yields
    (parameters, table). With ``current_code`` only entries whose code is unchanged since they were made (the
    version of the modules recorded in the entry, ``code_roots``, is the version now; older entries are stale:
    their keys can no longer be asked for)."""
    _check_name(name)
    folder = _root(root) / name
    versions: dict = {}
    wid = weights_id(model)
    for meta_path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        if wid is not None and meta.get("weights_sha256") != wid:
            continue
        if current_code:
            roots = tuple(meta.get("code_roots") or ())
            if roots not in versions:
                versions[roots] = codekey.code_version(roots)
            if meta.get("code_version") != versions[roots]:
                continue
        try:
            df = _load(meta_path.with_suffix(".csv"), meta_path, meta.get("key"))
        except CorruptEntry:
            continue
        yield meta.get("params", {}), df


def clear(name: str | None = None, root=None) -> int:
    """Delete the cached entries of ``name`` (or all); return how many files were removed."""
    base = _root(root)
    folders = [base / name] if name else [p for p in base.iterdir() if p.is_dir()] if base.exists() else []
    n = 0
    for folder in folders:
        for p in folder.glob("*"):
            if p.is_file():
                p.unlink()
                n += 1
    return n

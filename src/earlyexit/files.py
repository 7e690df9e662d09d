"""Writing files so that a reader never sees half of one, and JSON that hashes the same way every time.

    atomic_write(path, lambda f: f.write(data))     # a file appears whole or not at all
    with atomic_dir(target) as tmp:                 # a folder appears whole or not at all
        (tmp / "weights.safetensors").write_bytes(...)
    canonical({"b": 1, "a": (2, 3)})                # '{"a":[2,3],"b":1}'
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable


def atomic_write(path: os.PathLike, write: Callable) -> None:
    """Call ``write(binary_file)`` on a temporary file beside ``path``, fsync it, rename it to ``path``.

    A reader sees either the old file or the whole new one, never a part.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_bytes(path: os.PathLike, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def _plain(v: Any):
    """JSON default: numpy scalars/arrays and paths as plain values, anything else as its repr."""
    if hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", 1) == 0:
        return v.item()
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, (set, frozenset)):
        return sorted(v, key=repr)
    return repr(v)


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_plain, ensure_ascii=True)



@contextmanager
def atomic_dir(target: os.PathLike, prefix: str = ".tmp-"):
    """Yield a fresh temporary folder beside ``target``; when the block ends without an error, replace
    ``target`` by it (an existing ``target`` is removed first). On an error the temporary folder is
    deleted and ``target`` is left as it was, so ``target`` only ever appears complete.

    The folder is readable by all (``mkdtemp`` would make it private): what it holds is ordinary data.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=prefix))
    tmp.chmod(0o755)
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)

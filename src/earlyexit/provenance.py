"""What produced a result: code version, parameters, model weights, software, machine, date.

Every figure sidecar (earlyexit.figures) and every executed notebook (earlyexit.runner) carries
one of these records, so a number in the book can be traced to the exact run that made it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from .paths import REPO_ROOT

PACKAGE_DIR = Path(__file__).resolve().parent


def git_info(root: Path = REPO_ROOT) -> dict:
    """{"commit": sha or "unknown", "dirty": bool or None}. Dirty = tracked files differ from HEAD."""
    def run(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)

    try:
        head = run("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": "unknown", "dirty": None}
        status = run("status", "--porcelain", "--untracked-files=no")
        return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None}


def code_version(package_dir: Path = PACKAGE_DIR) -> str:
    """SHA-256 over the names and contents of the package's own ``*.py`` files.

    Unlike the git commit, it changes exactly when the library code changes (committed or not),
    and not when a notebook, the README or a profile does.
    """
    h = hashlib.sha256()
    for f in sorted(package_dir.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def software() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("torch", "transformers", "numpy", "pandas", "matplotlib", "gguf"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def device_info(model=None) -> dict:
    if model is not None:
        dev = str(model.device)
    else:
        try:
            import torch

            dev = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            dev = "cpu"
    out = {"device": dev}
    if dev.startswith("cuda"):
        import torch

        out["gpu"] = torch.cuda.get_device_name(torch.device(dev))
    else:
        out["cpu"] = platform.processor() or platform.machine()
    return out


def _jsonable(v: Any):
    """Parameters as JSON data (tuples become lists, unknown objects their repr)."""
    try:
        return json.loads(json.dumps(v))
    except (TypeError, ValueError):
        if isinstance(v, Mapping):
            return {str(k): _jsonable(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [_jsonable(x) for x in v]
        return repr(v)


def collect(params: Mapping[str, Any] | None = None, model=None, notebook: str | None = None) -> dict:
    """A provenance record for a result computed with ``params`` (and ``model``, a LoadedModel).

    Keys: notebook, profile, seed, parameters, git_commit, git_dirty, code_version, model (the
    LoadedModel's provenance: spec, weights_sha256, ...), software versions, device, date_utc.
    """
    notebook = notebook or getattr(params, "notebook", None) or (params or {}).get("notebook")
    params = dict(params or {})
    git = git_info()
    record = {
        "notebook": notebook,
        "profile": params.get("profile"),
        "seed": params.get("seed"),
        "parameters": _jsonable(params),
        "git_commit": git["commit"],
        "git_dirty": git["dirty"],
        "code_version": code_version(),
        "model": _jsonable(model.provenance()) if model is not None else None,
        "software": software(),
        **device_info(model),
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    return record


def rerun_command(notebook: str | None, profile: str | None) -> str:
    """The shell command that rebuilds a notebook's results (and so its figures)."""
    if not notebook:
        return "make book"
    return f"python -m earlyexit book --profile {profile or 'cpu'} --only {notebook} --rerun"


if __name__ == "__main__":  # pragma: no cover
    json.dump(collect(), sys.stdout, indent=2)

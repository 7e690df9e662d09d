"""What produced a result: code version, parameters, model weights, software, machine, date.

Every figure sidecar (earlyexit.book.figures) and every executed notebook (earlyexit.book.runner) carries
one of these records, so a number in the book can be traced to the exact run that made it.
"""
from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from ..paths import REPO_ROOT
from ..store.codekey import code_version


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
        "threads": threads_record(params.get("threads")),
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    return record


def threads_record(spec=None) -> dict:
    """The CPU threads torch uses, what asked for them (``threads`` parameter) and why that many: for "auto", the
    cores available to this process (affinity, cgroup quota, scheduler grant) and the workers sharing them."""
    import torch

    from ..engine.threads import available_cores, resolve_threads

    rec = {"torch_num_threads": torch.get_num_threads(), "asked": spec, "cores_available": available_cores()}
    if spec is not None:
        try:
            rec["why"] = resolve_threads(spec)[1]
        except ValueError as e:
            rec["why"] = str(e)
    return rec


def set_determinism(seed: int = 0, *, warn_only: bool = True) -> dict:
    """Seed Python, NumPy and torch with ``seed`` and ask torch for deterministic kernels.

    Calls ``torch.use_deterministic_algorithms(True, warn_only=warn_only)``: an op without a
    deterministic implementation warns (or, with ``warn_only=False``, raises) instead of silently
    varying. Returns what it set, as JSON data for a notebook's provenance record. On CPU, with the
    same software, thread count and inputs, a rerun gives the same bits. On CUDA some kernels have
    no deterministic version; the record says so, and ``CUBLAS_WORKSPACE_CONFIG`` is set here only
    if CUDA was not initialised yet (it has no effect afterwards).
    """
    import random

    import numpy as np
    import torch

    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds every CUDA device too
    cuda = torch.cuda.is_available()
    notes = []
    if cuda:
        if not torch.cuda.is_initialized():
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        elif os.environ.get("CUBLAS_WORKSPACE_CONFIG") is None:
            notes.append("CUDA was initialised before set_determinism: CUBLAS_WORKSPACE_CONFIG is unset, "
                         "so cuBLAS matrix products may vary between runs")
        notes.append("on CUDA some kernels (e.g. index_add, scatter_add, some attention backward passes) "
                     "have no deterministic implementation; "
                     + ("they warn and run anyway, so results may differ in the last bits between runs"
                        if warn_only else "they raise an error"))
    else:
        notes.append("CPU only: reruns give the same bits for the same software versions, thread count "
                     "and inputs")
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    return {
        "seed": seed,
        "seeded": ["python random", "numpy global", "torch (CPU and CUDA)"],
        "torch_deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_benchmark": False,
        "cudnn_deterministic": True,
        "torch_num_threads": torch.get_num_threads(),
        "cuda": cuda,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
        "bitwise_expected": not cuda,
        "notes": notes,
    }


def rerun_command(notebook: str | None, profile: str | None) -> str:
    """The shell command that rebuilds a notebook's results (and so its figures)."""
    if not notebook:
        return "make book"
    return f"python -m earlyexit book --profile {profile or 'cpu'} --only {notebook} --rerun"


if __name__ == "__main__":  # pragma: no cover
    json.dump(collect(), sys.stdout, indent=2)

"""Execute the book's notebooks under a profile with papermill, then build the HTML.

    python -m earlyexit book --profile {smoke,cpu,gpu} [--only NAME ...] [--rerun] [--retime] [--no-build] [--jobs N]

The table of contents (_toc.yml) is the list of chapters. An entry ``book/generated/<name>`` is an
executed notebook: its source is ``notebooks/<name>.ipynb`` (committed without outputs), its
parameters are the profile's ``common:`` section, then the profile's section for ``<name>``, plus
``profile: <profile name>``, all checked against the schema in ``earlyexit.book.params``.

A notebook whose executed copy already holds the same run hash (parameters, source, and the library code
its imports reach) is skipped unless ``--rerun``. A notebook is executed into a temporary file that is
renamed into place only when every cell ran; a failure stops the run, names the notebook and the
failing cell's error, and keeps the partial output at ``book/generated/<name>.failed.ipynb``.
With ``jobs`` above 1 (the profile's ``jobs:``, or ``--jobs``) up to that many notebooks execute at once, each
in a child process with its output in ``book/generated/.logs/<name>.log``: a notebook whose ``threads`` is not 1
(it takes every core) and the front page run alone, the former first, the rest in book order. Results two
notebooks both need are computed once (the result cache and the checkpoints are claimed,
:mod:`earlyexit.store.claims`). Each executed copy records in its metadata how many ran at once.
The run ends by checking that every figure the executed notebooks published has its PNG, PDF, SVG
and JSON sidecar under figures/ (:func:`check_figures`); a missing one fails it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from .. import paths
from .. import progress as progress_mod
from ..files import atomic_write_bytes, canonical
from . import params as params_mod
from .consistency import page_record
from .profiles import (GENERATED_PREFIX, PROFILE_KEYS, Profile, UsageError,  # noqa: F401
                       available_profiles, execution_order, load_profile, toc_notebooks, toc_path, toc_root)
from .provenance import git_info, rerun_command, software
from ..store.codekey import code_version, notebook_roots
from .jobs import job_order, progress_line, run_jobs, runs_alone, time_left
from .rerun import RERUN_TAG, add_rerun_box, papermill_command, rerun_box  # noqa: F401


# jupyter_client starts the "python3" kernel with sys.executable, so notebooks run in this very
# interpreter (the .venv that has earlyexit installed), whatever `python` is on PATH.
KERNEL = "python3"


def kernel_manager_class(sock_dir: Path):
    """A jupyter_client kernel manager whose kernel talks over Unix sockets in ``sock_dir`` (a directory of
    this execution's own) instead of TCP ports on 127.0.0.1; ``None`` where Unix sockets are not available
    (Windows), which keeps jupyter_client's TCP default.

    With TCP, jupyter_client picks five free ports, releases them and the kernel binds them a moment later:
    two notebooks that start at once can pick the same port, and one kernel dies with "Address already in
    use" (papermill issue #511; it happened here to one of two chapters started side by side). Socket files
    in a private directory cannot collide."""
    if os.name == "nt":
        return None
    from jupyter_client.manager import AsyncKernelManager

    class PrivateSocketKernelManager(AsyncKernelManager):
        def __init__(self, **kw):
            super().__init__(transport="ipc", ip=str(sock_dir / "kernel"), **kw)

    return PrivateSocketKernelManager


class NotebookFailed(Exception):
    pass


def source_path(name: str) -> Path:
    return paths.NOTEBOOKS / f"{name}.ipynb"


def executed_path(name: str) -> Path:
    return paths.GENERATED / f"{name}.ipynb"


def failed_path(name: str) -> Path:
    return paths.GENERATED / f"{name}.failed.ipynb"


def notebook_code(name: str) -> str:
    """The version of the library code notebook ``name`` can reach: the modules its code cells import and
    everything they import (:mod:`earlyexit.store.codekey`); the whole package if its imports cannot be read."""
    nb = json.loads(source_path(name).read_text())
    sources = ["".join(c.get("source", "")) for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    return code_version(notebook_roots(sources))


def run_hash(name: str, parameters: dict, code: str | None = None) -> str:
    """What an executed copy must match to be reused: its parameters, its source, and the library code it can
    reach (:func:`notebook_code`). Not the git commit: a commit that changes neither leaves the executed copy
    as it would be now (the box at its top names the commit it was executed at)."""
    blob = canonical({"notebook": name, "parameters": dict(parameters),
                      "source_sha256": hashlib.sha256(source_path(name).read_bytes()).hexdigest(),
                      "code_version": code or notebook_code(name)})
    return hashlib.sha256(blob.encode()).hexdigest()


def recorded(name: str) -> dict:
    """The earlyexit metadata of the executed copy of ``name`` ({} if none or unreadable)."""
    return page_record(executed_path(name))


def _fold(cell, prompt: str) -> None:
    tags = cell.setdefault("metadata", {}).setdefault("tags", [])
    if "hide-cell" not in tags and "remove-cell" not in tags:
        tags.append("hide-cell")
    # myst-nb formats the prompt with {type}: keep braces out of it
    cell["metadata"].setdefault("mystnb", {})["code_prompt_show"] = prompt.replace("{", "(").replace("}", ")")


def _tag_for_book(nb, parameters: dict | None = None) -> None:
    """Fold the parameter cells and the set-up in the HTML, each behind a one-line summary, so that a chapter
    opens with its claim (the values stay one click away)."""
    parameters = dict(parameters or {})
    shown = ", ".join(f"{k} {parameters[k]}" for k in ("model", "device") if k in parameters)
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags:
            _fold(cell, f"Parameters of this build: profile {parameters.get('profile', '?')}, {shown} "
                        f"({len(parameters)} values)")
        elif "parameters" in tags:
            _fold(cell, "Parameters and their defaults")
        elif "chapter.setup(" in cell.get("source", ""):
            _fold(cell, "Set-up")


def execute(name: str, parameters: dict, *, timeout_s: int | None = None, progress: bool = True,
            meta: dict | None = None) -> Path:
    """Run notebooks/<name>.ipynb with ``parameters`` into book/generated/<name>.ipynb.

    Raises NotebookFailed (after saving <name>.failed.ipynb) when a cell raises.
    """
    import nbformat
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    src, out, failed = source_path(name), executed_path(name), failed_path(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{name}.running.ipynb")
    env_before = os.environ.get("EARLYEXIT_PROGRESS")
    os.environ["EARLYEXIT_PROGRESS"] = "0"  # the kernel inherits it: no tqdm bars inside the book
    t0 = time.perf_counter()
    sock_dir = Path(tempfile.mkdtemp(prefix="earlyexit-kernel-"))
    km = kernel_manager_class(sock_dir)
    try:
        pm.execute_notebook(str(src), str(tmp), parameters=dict(parameters), kernel_name=KERNEL,
                            progress_bar=progress, log_output=False, cwd=str(paths.NOTEBOOKS),
                            execution_timeout=timeout_s, **({"kernel_manager_class": km} if km else {}))
    except PapermillExecutionError as e:
        if tmp.exists():
            os.replace(tmp, failed)
        cell = f"cell [{e.exec_count}]" if e.exec_count is not None else f"cell #{e.cell_index}"
        where = _failing_line(e)
        evalue = str(e.evalue).strip()
        raise NotebookFailed(f"notebook {name} failed in {cell}{where}: {e.ename}: {evalue}\n"
                             f"partial output kept at {paths.relative(failed)}") from None
    except BaseException:
        if tmp.exists():
            os.replace(tmp, failed)
        raise
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
        if env_before is None:
            os.environ.pop("EARLYEXIT_PROGRESS", None)
        else:
            os.environ["EARLYEXIT_PROGRESS"] = env_before
    nb = nbformat.read(tmp, as_version=4)
    _tag_for_book(nb, parameters)
    nb.metadata["earlyexit"] = {**(meta or {}), "duration_s": round(time.perf_counter() - t0, 1),
                                "executed_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    add_rerun_box(nb, name)
    atomic_write_bytes(out, nbformat.writes(nb).encode())
    tmp.unlink(missing_ok=True)
    failed.unlink(missing_ok=True)
    return out


def _failing_line(e) -> str:
    """' line N `code`': the line of the notebook cell where the error was raised, from IPython's
    traceback (its first '---->' marker is in the cell itself); '' if it cannot be found."""
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(getattr(e, "traceback", None) or []))
    m = re.search(r"^-+>\s*(\d+)\s(.*)$", tb, flags=re.M)
    return f" line {m.group(1)} `{m.group(2).strip()[:80]}`" if m else ""


CITE_FILES = re.compile(r"figures/([^\s/,;'\"]+)\.json")


def check_figures(notebook_names) -> list[str]:
    """What is wrong with the figure files of the executed notebooks (an empty list if nothing).

    Every figure a notebook publishes (``figures.publish``) is glued with a ``<key>_cite`` note that
    names its files. Each must exist under figures/ as PNG, PDF and SVG, with a JSON sidecar that
    holds 'rerun' and 'provenance' and was written by that notebook. Notebooks not executed yet are
    skipped.
    """
    from .figures import FORMATS

    problems = []
    for name in notebook_names:
        path = executed_path(name)
        if not path.exists():
            continue
        try:
            nb = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            problems.append(f"{name}: cannot read {paths.relative(path)}: {e}")
            continue
        rerun = "rebuild: " + rerun_command(name, nb.get("metadata", {}).get("earlyexit", {}).get("profile"))
        for cell in nb.get("cells", []):
            for out in cell.get("outputs", []):
                book = out.get("metadata", {}).get("scrapbook", {})
                if not str(book.get("name", "")).endswith("_cite"):
                    continue
                text = out.get("data", {}).get(book.get("mime_prefix", "") + "text/plain", "")
                figs = CITE_FILES.findall(text)
                if not figs:
                    problems.append(f"{name}: glued note {book['name']!r} names no figures/<name>.json")
                for fig in dict.fromkeys(figs):
                    missing = [f"figures/{fig}.{ext}" for ext in (*FORMATS, "json")
                               if not (paths.FIGURES / f"{fig}.{ext}").exists()]
                    if missing:
                        problems.append(f"{name}: figure {fig!r} has no {', '.join(missing)} ({rerun})")
                        continue
                    try:
                        side = json.loads((paths.FIGURES / f"{fig}.json").read_text())
                    except (OSError, ValueError) as e:
                        problems.append(f"{name}: figures/{fig}.json is not readable JSON: {e} ({rerun})")
                        continue
                    lacks = [k for k in ("rerun", "provenance") if not side.get(k)]
                    if lacks:
                        problems.append(f"{name}: figures/{fig}.json lacks {', '.join(lacks)} ({rerun})")
                    elif side["provenance"].get("notebook") not in (None, name):
                        problems.append(f"{name}: figures/{fig}.json was written by notebook "
                                        f"{side['provenance']['notebook']!r}: two notebooks publish one figure name")
    return problems


def build_html(strict: bool = True) -> int:
    """``jupyter-book build . --all -W -n --keep-going`` with this interpreter's jupyter-book.

    ``--all`` starts from a fresh Sphinx environment, so a warning in an unchanged page is reported
    again instead of hiding behind the previous build's cache.
    """
    exe = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c",
                                             "from jupyter_book.cli.main import main; main()"]
    flags = ["--all"] + (["-W", "-n", "--keep-going"] if strict else [])
    index = paths.REPO_ROOT / "_build" / "html" / "index.html"
    if index.exists() and index.stat().st_size < 500 and "http-equiv=\"Refresh\"" in index.read_text():
        index.unlink()  # the redirect to the root page is written only when missing: renew it, the root may move
    cmd += ["build", str(paths.REPO_ROOT), *flags]
    print("$ jupyter-book build . " + " ".join(flags), flush=True)
    return subprocess.run(cmd, cwd=paths.REPO_ROOT).returncode


def _execute_jobs(todo: dict, profile: Profile, jobs: int, rerun: bool, root: str | None, last: dict) -> int:
    """The out-of-date notebooks ``todo`` ({name: its parameters}), up to ``jobs`` at once, each in a child
    ``python -m earlyexit book --only NAME --no-build`` (no progress bars: they would interleave); ``last``:
    {name: seconds the last build took}, for the estimate of the time left."""
    alone = {n for n, parameters in todo.items() if runs_alone(n, parameters, root)}
    env = {**os.environ, "EARLYEXIT_PROGRESS": "0", "EARLYEXIT_BOOK_JOBS": str(jobs)}

    def command(name):
        return [sys.executable, "-m", "earlyexit", "book", "--profile", profile.name, "--only", name,
                "--no-build", "--jobs", "1"] + (["--rerun"] if rerun else [])

    return run_jobs(job_order(list(todo), alone, root, profile.first), alone, jobs, command, env,
                    f" with profile {profile.name}", last=last)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m earlyexit book",
        description="Execute the book's notebooks under a profile with papermill, then build the HTML.")
    p.add_argument("--profile", default="cpu", help="profiles/<name>.yml: smoke, cpu or gpu (default cpu)")
    p.add_argument("--only", nargs="+", metavar="NAME", default=None,
                   help="execute only these notebooks (names as in _toc.yml, e.g. 01_kv_cache_invariant)")
    p.add_argument("--rerun", action="store_true", help="execute even if the executed copy is up to date")
    p.add_argument("--retime", action="store_true", help="move the result store's timings aside (nothing else) and "
                   "execute again (implies --rerun): a second timing run; compare with earlyexit.book.agreement")
    p.add_argument("--no-build", action="store_true", help="execute only; do not build the HTML")
    p.add_argument("--no-strict", action="store_true", help="build without -W -n (warnings not errors)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="notebooks executed at once (default: the profile's jobs, else 1); a notebook whose "
                        "threads is not 1, and the front page, always run alone")
    return p


def _plan(args) -> tuple[Profile, list[str], list[str]]:
    """Check everything that can be checked before any work: raise UsageError on a problem."""
    valid_profiles = available_profiles()
    if args.profile not in valid_profiles:
        raise UsageError(f"unknown profile {args.profile!r}{params_mod.suggest(args.profile, valid_profiles)}; "
                         f"valid: {', '.join(valid_profiles)}")
    names = toc_notebooks()
    if args.only:
        bad = [n for n in args.only if n not in names]
        if bad:
            hint = "".join(params_mod.suggest(b, names) for b in bad[:1])
            raise UsageError(f"unknown notebook {', '.join(map(repr, bad))}{hint}; "
                             f"valid: {', '.join(names) or '(none listed in _toc.yml)'}")
    problems = []
    for n in names:
        if not source_path(n).exists():
            problems.append(f"_toc.yml lists book/generated/{n} but notebooks/{n}.ipynb does not exist")
        if n not in params_mod.SCHEMAS:
            problems.append(f"notebook {n} has no parameter schema: add register({n!r}, ...) to "
                            f"src/earlyexit/params.py")
    if problems:
        raise UsageError("the book is not wired up:\n  - " + "\n  - ".join(problems))
    jobs = getattr(args, "jobs", None)          # the sweep command plans with its own arguments, without --jobs
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    profile = load_profile(args.profile, notebooks=names)
    selected = execution_order([n for n in names if not args.only or n in args.only], toc_root())
    return profile, names, selected


def _figures_ok(names) -> bool:
    """Report :func:`check_figures`'s problems on stderr; True when there are none."""
    problems = check_figures(names)
    if problems:
        print("error: the figure files of the book are incomplete:\n  - " + "\n  - ".join(problems),
              file=sys.stderr)
    return not problems


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        profile, names, selected = _plan(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    git = git_info()
    sw = software()
    t_all = time.perf_counter()
    jobs = args.jobs if args.jobs is not None else profile.jobs
    print(f"profile {profile.name}: {profile.description}".rstrip(": "), flush=True)
    if args.retime:
        from .agreement import clear_timed
        print(f"moved {clear_timed()} timed result files to cleared-timings/; every notebook executes again", flush=True)
        args.rerun = True
    todo = {}
    for i, name in enumerate(selected, 1):
        parameters = dict(profile.parameters(name))
        code = notebook_code(name)
        h = run_hash(name, parameters, code)
        if not args.rerun and recorded(name).get("run_hash") == h:
            print(f"[{i}/{len(selected)}] {name}: up to date (profile {profile.name}), skipped; --rerun to execute "
                  f"anyway", flush=True)
        else:
            todo[name] = (i, parameters, h, code)
    last = {n: recorded(n).get("duration_s") for n in todo}      # the last build's times, for the estimate
    if jobs > 1 and len(todo) > 1:
        print(f"executing {len(todo)} notebooks, up to {jobs} at once", flush=True)
        if _execute_jobs({n: v[1] for n, v in todo.items()}, profile, jobs, args.rerun, toc_root(), last) != 0:
            return 1
        todo = {}
    for k, (name, (i, parameters, h, code)) in enumerate(todo.items(), 1):
        head = f"[{i}/{len(selected)}] {name}"
        print(f"{head}: executing with profile {profile.name}", flush=True)
        meta = {"run_hash": h, "notebook": name, "profile": profile.name, "parameters": parameters,
                "source": f"notebooks/{name}.ipynb", "git_commit": git["commit"], "git_dirty": git["dirty"],
                "code_version": code, "software": sw,
                "jobs": int(os.environ.get("EARLYEXIT_BOOK_JOBS", "1"))}
        t0 = time.perf_counter()
        try:
            execute(name, parameters, timeout_s=profile.timeout_s, meta=meta, progress=progress_mod.enabled())
        except NotebookFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        now = time.perf_counter()
        rest = list(todo)[k:]
        print(progress_line(k, len(todo), name, now - t0, now - t_all, time_left(rest, {}, last, 1) if rest else None),
              flush=True)
    if args.no_build:
        if _figures_ok(selected):
            print(f"executed in {time.perf_counter() - t_all:.0f} s; HTML not built (--no-build)")
            return 0
        return 1
    missing = [n for n in names if not executed_path(n).exists()]
    if missing:
        print(f"HTML not built: no executed copy yet of {', '.join(missing)} "
              f"(run `python -m earlyexit book --profile {profile.name}` without --only)", file=sys.stderr)
        return 1
    profiles_used = {n: recorded(n).get("profile") for n in names}
    mixed = {n: p for n, p in profiles_used.items() if p != profile.name}
    if mixed:
        print("note: the book mixes profiles: " + ", ".join(f"{n} ran under {p}" for n, p in mixed.items()),
              flush=True)
    rc = build_html(strict=not args.no_strict)
    if rc != 0:
        print(f"error: jupyter-book build failed (exit code {rc}); see the warnings above", file=sys.stderr)
        return 1
    if not _figures_ok(names):
        return 1
    index = paths.REPO_ROOT / "_build" / "html" / "index.html"
    print(f"book built in {time.perf_counter() - t_all:.0f} s; open it at\n{index}")
    return 0


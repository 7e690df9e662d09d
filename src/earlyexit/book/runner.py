"""Execute the book's notebooks under a profile with papermill, then build the HTML.

    python -m earlyexit book --profile {smoke,cpu,gpu} [--only NAME ...] [--rerun] [--no-build]

The table of contents (_toc.yml) is the list of chapters. An entry ``book/generated/<name>`` is an
executed notebook: its source is ``notebooks/<name>.ipynb`` (committed without outputs), its
parameters are the profile's ``common:`` section, then the profile's section for ``<name>``, plus
``profile: <profile name>``, all checked against the schema in ``earlyexit.params``.

A notebook whose executed copy already holds the same run hash (parameters, source, git commit,
library code) is skipped unless ``--rerun``. A notebook is executed into a temporary file that is
renamed into place only when every cell ran; a failure stops the run, names the notebook and the
failing cell's error, and keeps the partial output at ``book/generated/<name>.failed.ipynb``.
The run ends by checking that every figure the executed notebooks published has its PNG, PDF, SVG
and JSON sidecar under figures/ (:func:`check_figures`); a missing one fails it.
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from . import params as params_mod
from .. import paths
from .provenance import code_version, git_info, rerun_command, software
from ..files import atomic_write_bytes, canonical

GENERATED_PREFIX = "book/generated/"
PROFILE_KEYS = {
    "description": "one line: what this profile is for and how long it takes",
    "common": "parameters given to every notebook (only the COMMON ones: "
              + ", ".join(params_mod.COMMON) + ")",
    "notebooks": "per-notebook parameters: {notebook name: {parameter: value}}",
    "timeout_s": "longest a single cell may run, in seconds (default: no limit)",
}
# jupyter_client starts the "python3" kernel with sys.executable, so notebooks run in this very
# interpreter (the .venv that has earlyexit installed), whatever `python` is on PATH.
KERNEL = "python3"


class UsageError(Exception):
    """A mistake in the command line or a profile: reported in one message, exit code 2."""


class NotebookFailed(Exception):
    pass


# ---------------------------------------------------------------------------------- toc / profiles

def toc_path() -> Path:
    return paths.REPO_ROOT / "_toc.yml"


def toc_notebooks(path: Path | None = None) -> list[str]:
    """Names of the executed notebooks listed in the table of contents, in book order."""
    toc = yaml.safe_load(Path(path or toc_path()).read_text())
    found: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            for key in ("root", "file"):
                f = node.get(key)
                if isinstance(f, str) and f.startswith(GENERATED_PREFIX):
                    found.append(Path(f[len(GENERATED_PREFIX):]).with_suffix("").name
                                 if f.endswith(".ipynb") else f[len(GENERATED_PREFIX):])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(toc)
    return found


def toc_root(path: Path | None = None) -> str | None:
    """The executed notebook that is the book's first page, if the root is one."""
    root = yaml.safe_load(Path(path or toc_path()).read_text()).get("root")
    if isinstance(root, str) and root.startswith(GENERATED_PREFIX):
        return Path(root[len(GENERATED_PREFIX):]).with_suffix("").name if root.endswith(".ipynb") \
            else root[len(GENERATED_PREFIX):]
    return None


def execution_order(names: list[str], root: str | None) -> list[str]:
    """The order notebooks run in: book order, except that the front page runs last, because it
    summarises the chapters (it reads their results from the result cache rather than computing them)."""
    return [n for n in names if n != root] + ([root] if root in names else [])


def available_profiles(profiles_dir: Path | None = None) -> list[str]:
    d = Path(profiles_dir or paths.PROFILES)
    return sorted(p.stem for p in d.glob("*.yml"))


def _rel(p: Path) -> str:
    """``p`` relative to the repository root where it lies inside it."""
    p = Path(p)
    return str(p.relative_to(paths.REPO_ROOT)) if p.is_relative_to(paths.REPO_ROOT) else str(p)


def _suggest(name, valid) -> str:
    close = difflib.get_close_matches(str(name), list(valid), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass
class Profile:
    name: str
    description: str
    common: dict
    notebooks: dict
    timeout_s: int | None

    def parameters(self, notebook: str) -> params_mod.Params:
        """The validated parameters of ``notebook`` under this profile (defaults filled in)."""
        raw = {**self.common, **self.notebooks.get(notebook, {}), "profile": self.name}
        return params_mod.validate(params_mod.get(notebook), raw)


def load_profile(name: str, profiles_dir: Path | None = None, notebooks: list[str] | None = None) -> Profile:
    """Read and validate ``profiles/<name>.yml``; raise UsageError listing every problem."""
    d = Path(profiles_dir or paths.PROFILES)
    valid = available_profiles(d)
    if name not in valid:
        raise UsageError(f"unknown profile {name!r}{_suggest(name, valid)}; valid: {', '.join(valid)}")
    path = d / f"{name}.yml"
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise UsageError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: must be a mapping with keys {', '.join(PROFILE_KEYS)}")
    problems = []
    for k in data:
        if k not in PROFILE_KEYS:
            problems.append(f"unknown key {k!r}{_suggest(k, PROFILE_KEYS)}; valid keys: {', '.join(PROFILE_KEYS)}")
    common = data.get("common") or {}
    nbs = data.get("notebooks") or {}
    if not isinstance(common, dict):
        problems.append("'common' must be a mapping of parameter: value")
        common = {}
    if not isinstance(nbs, dict):
        problems.append("'notebooks' must be a mapping of notebook name: {parameter: value}")
        nbs = {}
    for k in common:
        if k not in params_mod.COMMON:
            problems.append(f"common: {k!r} is not a common parameter{_suggest(k, params_mod.COMMON)}; "
                            f"common ones: {', '.join(params_mod.COMMON)} (put notebook-specific ones "
                            f"under notebooks: <name>:)")
    if "profile" in common:
        problems.append("common: 'profile' is set by the runner from the file name; remove it")
    known = list(notebooks) if notebooks is not None else sorted(params_mod.SCHEMAS)
    timeout = data.get("timeout_s")
    if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0):
        problems.append(f"timeout_s must be a positive integer number of seconds, got {timeout!r}")
    prof = Profile(name, str(data.get("description", "")), dict(common), {}, timeout)
    for nb, values in nbs.items():
        if nb not in known:
            problems.append(f"notebooks: unknown notebook {nb!r}{_suggest(nb, known)}; known: {', '.join(known)}")
            continue
        if not isinstance(values, dict):
            problems.append(f"notebooks: {nb}: must be a mapping of parameter: value")
            continue
        prof.notebooks[nb] = dict(values)
    for nb in known:
        if nb not in params_mod.SCHEMAS:
            continue
        try:
            prof.parameters(nb)
        except ValueError as e:
            lines = [ln.strip()[2:] for ln in str(e).splitlines() if ln.strip().startswith("- ")]
            problems += [f"notebooks: {nb}: {ln}" for ln in lines]
    if problems:
        raise UsageError(f"profile {name!r} ({_rel(path)}) is invalid:\n  - " + "\n  - ".join(dict.fromkeys(problems)))
    return prof


# ------------------------------------------------------------------------------------- execution

def source_path(name: str) -> Path:
    return paths.NOTEBOOKS / f"{name}.ipynb"


def executed_path(name: str) -> Path:
    return paths.GENERATED / f"{name}.ipynb"


def failed_path(name: str) -> Path:
    return paths.GENERATED / f"{name}.failed.ipynb"


def run_hash(name: str, parameters: dict, git_commit: str | None = None, code: str | None = None) -> str:
    """What an executed copy must match to be reused: parameters, source, git commit, library code."""
    blob = canonical({"notebook": name, "parameters": dict(parameters),
                      "source_sha256": hashlib.sha256(source_path(name).read_bytes()).hexdigest(),
                      "git_commit": git_commit if git_commit is not None else git_info()["commit"],
                      "code_version": code or code_version()})
    return hashlib.sha256(blob.encode()).hexdigest()


def recorded(name: str) -> dict:
    """The earlyexit metadata of the executed copy of ``name`` ({} if none or unreadable)."""
    p = executed_path(name)
    if not p.exists():
        return {}
    try:
        return json.loads(p.read_text()).get("metadata", {}).get("earlyexit", {}) or {}
    except (OSError, ValueError):
        return {}


def _tag_for_book(nb) -> None:
    """Fold papermill's injected-parameters cell in the HTML (the values stay one click away)."""
    for cell in nb.cells:
        tags = cell.setdefault("metadata", {}).setdefault("tags", [])
        if "injected-parameters" in tags and "hide-cell" not in tags:
            tags.append("hide-cell")


# ------------------------------------------------------------------------------------ rerun box

RERUN_TAG = "earlyexit-rerun"  # tag and CSS class of the generated box (tests and the browser check find it)


def _papermill_value(value) -> str:
    """How ``papermill -p`` reads ``value`` back: True/False/None/int/float literals, else a string."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return str(value)


def papermill_command(name: str, parameters: dict, defaults: dict | None = None, width: int | None = None) -> str:
    """The ``papermill`` command that runs ``notebooks/<name>.ipynb`` with ``parameters`` outside the book.

    Only the values that differ from ``defaults`` (the notebook's own, from its schema) are passed, plus
    ``profile``. Scalars go through ``-p`` (papermill turns "3" into 3 and "None" into None), a string
    that papermill would read as something else through ``-r`` (raw), lists and mappings through ``-y``
    (YAML). With ``width``, the command is wrapped into lines of about that many characters, joined by
    the shell's `` \\`` continuation.
    """
    import shlex

    from papermill.cli import _resolve_type

    defaults = dict(defaults or {})
    units = [f"papermill notebooks/{name}.ipynb {name}.out.ipynb"]
    for key, value in parameters.items():
        if key != "profile" and key in defaults and defaults[key] == value \
                and type(defaults[key]) is type(value):
            continue
        if isinstance(value, (list, tuple, dict)):
            units.append("-y " + shlex.quote(json.dumps({key: value})))
        elif isinstance(value, str) and _resolve_type(value) != value:
            units.append(f"-r {key} {shlex.quote(value)}")
        else:
            units.append(f"-p {key} {shlex.quote(_papermill_value(value))}")
    if not width:
        return " ".join(units)
    lines = [units[0]]
    for u in units[1:]:
        if len(lines[-1]) + 1 + len(u) > width:
            lines.append("    " + u)
        else:
            lines[-1] += " " + u
    return " \\\n".join(lines)


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def rerun_box(name: str, meta: dict) -> str:
    """The markdown of the box that opens an executed chapter: how it was made and how to rebuild it.

    ``meta`` is the notebook's ``earlyexit`` metadata (profile, parameters, duration_s, git_commit,
    git_dirty, executed_utc). The title carries the facts (profile, run time, commit); the commands
    are one click away (a dropdown), so the chapter still opens with its claim.
    """
    profile = meta.get("profile") or "cpu"
    commit = str(meta.get("git_commit") or "unknown")
    short = commit[:12] if commit != "unknown" else commit
    dirty = " (with uncommitted changes)" if meta.get("git_dirty") else ""
    when = str(meta.get("executed_utc", ""))[:10]
    try:
        defaults = dict(params_mod.get(name).defaults())
    except ValueError:
        defaults = {}
    pm_cmd = papermill_command(name, dict(meta.get("parameters") or {}), defaults, width=88)
    book_cmd = rerun_command(name, profile)
    took = _duration(float(meta.get("duration_s") or 0))
    return "\n".join([
        f":::{{admonition}} Built with profile `{profile}` in {took}, at commit `{short}`{dirty}",
        f":class: dropdown note {RERUN_TAG}",
        "",
        f"This page is the notebook `notebooks/{name}.ipynb`, executed on {when} (UTC) with the "
        f"parameters of `profiles/{profile}.yml`. The download button above offers the executed notebook.",
        "Rebuild it as part of the book (from the repository root, in its `.venv`):",
        "",
        "```bash",
        book_cmd,
        "```",
        "",
        "or run it alone with papermill (the values that differ from the notebook's defaults):",
        "",
        "```bash",
        pm_cmd,
        "```",
        "",
        f"Commit: `{commit}`{dirty}.",
        ":::",
    ])


def add_rerun_box(nb, name: str) -> None:
    """Insert :func:`rerun_box` after the notebook's first markdown cell (its title and claim),
    replacing a box inserted before."""
    import nbformat

    nb.cells = [c for c in nb.cells if RERUN_TAG not in c.get("metadata", {}).get("tags", [])]
    cell = nbformat.v4.new_markdown_cell(rerun_box(name, nb.metadata.get("earlyexit", {})))
    cell.metadata["tags"] = [RERUN_TAG]
    cell.pop("id", None)
    cell["id"] = f"{RERUN_TAG}-box"
    first_md = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"), -1)
    nb.cells.insert(first_md + 1, cell)


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
    try:
        pm.execute_notebook(str(src), str(tmp), parameters=dict(parameters), kernel_name=KERNEL,
                            progress_bar=progress, log_output=False, cwd=str(paths.NOTEBOOKS),
                            execution_timeout=timeout_s)
    except PapermillExecutionError as e:
        if tmp.exists():
            os.replace(tmp, failed)
        cell = f"cell [{e.exec_count}]" if e.exec_count is not None else f"cell #{e.cell_index}"
        where = _failing_line(e)
        evalue = str(e.evalue).strip()
        raise NotebookFailed(f"notebook {name} failed in {cell}{where}: {e.ename}: {evalue}\n"
                             f"partial output kept at {_rel(failed)}") from None
    except BaseException:
        if tmp.exists():
            os.replace(tmp, failed)
        raise
    finally:
        if env_before is None:
            os.environ.pop("EARLYEXIT_PROGRESS", None)
        else:
            os.environ["EARLYEXIT_PROGRESS"] = env_before
    nb = nbformat.read(tmp, as_version=4)
    _tag_for_book(nb)
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
            problems.append(f"{name}: cannot read {_rel(path)}: {e}")
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


# ------------------------------------------------------------------------------------------- CLI

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m earlyexit book",
        description="Execute the book's notebooks under a profile with papermill, then build the HTML.")
    p.add_argument("--profile", default="cpu", help="profiles/<name>.yml: smoke, cpu or gpu (default cpu)")
    p.add_argument("--only", nargs="+", metavar="NAME", default=None,
                   help="execute only these notebooks (names as in _toc.yml, e.g. 01_kv_cache_invariant)")
    p.add_argument("--rerun", action="store_true", help="execute even if the executed copy is up to date")
    p.add_argument("--no-build", action="store_true", help="execute only; do not build the HTML")
    p.add_argument("--no-strict", action="store_true", help="build without -W -n (warnings not errors)")
    return p


def _plan(args) -> tuple[Profile, list[str], list[str]]:
    """Check everything that can be checked before any work: raise UsageError on a problem."""
    valid_profiles = available_profiles()
    if args.profile not in valid_profiles:
        raise UsageError(f"unknown profile {args.profile!r}{_suggest(args.profile, valid_profiles)}; "
                         f"valid: {', '.join(valid_profiles)}")
    names = toc_notebooks()
    if args.only:
        bad = [n for n in args.only if n not in names]
        if bad:
            hint = "".join(_suggest(b, names) for b in bad[:1])
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
    code = code_version()
    sw = software()
    t_all = time.perf_counter()
    print(f"profile {profile.name}: {profile.description}".rstrip(": "), flush=True)
    for i, name in enumerate(selected, 1):
        parameters = dict(profile.parameters(name))
        h = run_hash(name, parameters, git["commit"], code)
        head = f"[{i}/{len(selected)}] {name}"
        if not args.rerun and recorded(name).get("run_hash") == h:
            print(f"{head}: up to date (profile {profile.name}), skipped; --rerun to execute anyway", flush=True)
            continue
        print(f"{head}: executing with profile {profile.name}", flush=True)
        meta = {"run_hash": h, "notebook": name, "profile": profile.name, "parameters": parameters,
                "source": f"notebooks/{name}.ipynb", "git_commit": git["commit"], "git_dirty": git["dirty"],
                "code_version": code, "software": sw}
        t0 = time.perf_counter()
        try:
            execute(name, parameters, timeout_s=profile.timeout_s, meta=meta)
        except NotebookFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"{head}: done in {time.perf_counter() - t0:.0f} s", flush=True)
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

"""The book's table of contents and its profiles: which notebooks make the book, in which order they run, and
the validated parameters a profile gives each of them (``profiles/<name>.yml``)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from .. import paths
from . import params as params_mod


GENERATED_PREFIX = "book/generated/"


PROFILE_KEYS = {
    "description": "one line: what this profile is for and how long it takes",
    "common": "parameters given to every notebook (only the COMMON ones: "
              + ", ".join(params_mod.COMMON) + ")",
    "notebooks": "per-notebook parameters: {notebook name: {parameter: value}}",
    "timeout_s": "longest a single cell may run, in seconds (default: no limit)",
    "jobs": "notebooks executed at once (default 1); a notebook whose threads is not 1, and the front page, run alone",
    "first": "with jobs above 1: the notebooks that start first among those run side by side, in this order "
             "(the longest ones, so that the short ones fill the end); the others follow in book order",
}


class UsageError(Exception):
    """A mistake in the command line or a profile: reported in one message, exit code 2."""


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


@dataclass
class Profile:
    name: str
    description: str
    common: dict
    notebooks: dict
    timeout_s: int | None
    jobs: int = 1
    first: tuple = ()

    def parameters(self, notebook: str) -> params_mod.Params:
        """The validated parameters of ``notebook`` under this profile (defaults filled in)."""
        raw = {**self.common, **self.notebooks.get(notebook, {}), "profile": self.name}
        return params_mod.validate(params_mod.get(notebook), raw)


def load_profile(name: str, profiles_dir: Path | None = None, notebooks: list[str] | None = None) -> Profile:
    """Read and validate ``profiles/<name>.yml``; raise UsageError listing every problem."""
    d = Path(profiles_dir or paths.PROFILES)
    valid = available_profiles(d)
    if name not in valid:
        raise UsageError(f"unknown profile {name!r}{params_mod.suggest(name, valid)}; valid: {', '.join(valid)}")
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
            problems.append(f"unknown key {k!r}{params_mod.suggest(k, PROFILE_KEYS)}; valid keys: {', '.join(PROFILE_KEYS)}")
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
            problems.append(f"common: {k!r} is not a common parameter{params_mod.suggest(k, params_mod.COMMON)}; "
                            f"common ones: {', '.join(params_mod.COMMON)} (put notebook-specific ones "
                            f"under notebooks: <name>:)")
    if "profile" in common:
        problems.append("common: 'profile' is set by the runner from the file name; remove it")
    known = list(notebooks) if notebooks is not None else sorted(params_mod.SCHEMAS)
    def positive_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v > 0

    timeout = data.get("timeout_s")
    if timeout is not None and not positive_int(timeout):
        problems.append(f"timeout_s must be a positive integer number of seconds, got {timeout!r}")
    jobs = data.get("jobs", 1)
    if not positive_int(jobs):
        problems.append(f"jobs must be a positive integer (notebooks executed at once), got {jobs!r}")
        jobs = 1
    first = data.get("first") or []
    if not isinstance(first, list) or not all(isinstance(n, str) for n in first):
        problems.append(f"first must be a list of notebook names, got {first!r}")
        first = []
    for nb in first:
        if nb not in known:
            problems.append(f"first: unknown notebook {nb!r}{params_mod.suggest(nb, known)}; known: {', '.join(known)}")
    if len(set(first)) != len(first):
        problems.append(f"first: a notebook is listed twice: {first!r}")
    prof = Profile(name, str(data.get("description", "")), dict(common), {}, timeout, jobs, tuple(first))
    for nb, values in nbs.items():
        if nb not in known:
            problems.append(f"notebooks: unknown notebook {nb!r}{params_mod.suggest(nb, known)}; known: {', '.join(known)}")
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
        raise UsageError(f"profile {name!r} ({paths.relative(path)}) is invalid:\n  - " + "\n  - ".join(dict.fromkeys(problems)))
    return prof


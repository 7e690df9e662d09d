"""Which code a result depends on: the package's modules a computation can reach, and one hash over them.

    code_version()                                   # every module of the package (the safe default)
    code_version(["earlyexit.experiments.points"])   # points.py and every module it imports, transitively
    roots_for(compute_fn)                            # the modules of the running computation (see below)

A result-cache key (:mod:`earlyexit.store.results`) and a notebook's run hash (:mod:`earlyexit.book.runner`)
cover the code that can change what they compute, and nothing else: editing the book's build tooling, a
chapter's prose or a test recomputes no point, and editing the engine recomputes every point whose code
imports it.

The import graph is read statically from the source (every ``import`` and ``from ... import`` anywhere in a
file, the ones inside functions included) and closed transitively; importing ``a.b.c`` runs ``a/__init__.py``
and ``a/b/__init__.py`` too, so those count. When in doubt it recomputes: a computation whose code cannot be
placed in the package (a function defined in a notebook or a test) is keyed by the whole package, as is a
module that imports through ``importlib``.
"""
from __future__ import annotations

import ast
import hashlib
import sys
from pathlib import Path
from typing import Callable, Iterable

PACKAGE = "earlyexit"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
STORE = f"{PACKAGE}.store"   # the store's own frames are passed over when looking for who asks it

_parsed: dict = {}   # (path, mtime_ns, size) -> (sha256 of the bytes, imported names, dynamic?)


def module_file(mod: str, package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The source file of module ``mod`` (dotted, starting with the package name), or None if it is none of
    the package's."""
    parts = mod.split(".")
    if parts[0] != PACKAGE:
        return None
    base = package_dir.joinpath(*parts[1:])
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _read(path: Path) -> tuple[str, list[tuple[int, str, tuple]], bool]:
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _parsed:
        data = path.read_bytes()
        found, dynamic = [], False
        for node in ast.walk(ast.parse(data, filename=str(path))):
            if isinstance(node, ast.Import):
                found += [(0, a.name, ()) for a in node.names]
                dynamic |= any(a.name.split(".")[0] == "importlib" and a.name != "importlib.metadata"
                               for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                found.append((node.level, node.module or "", tuple(a.name for a in node.names)))
                dynamic |= node.module == "importlib" and "import_module" in [a.name for a in node.names]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
                dynamic = True
        _parsed[key] = (hashlib.sha256(data).hexdigest(), found, dynamic)
    return _parsed[key]


def _with_parents(mod: str) -> list[str]:
    parts = mod.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def direct_imports(mod: str, package_dir: Path = PACKAGE_DIR) -> tuple[set[str], bool]:
    """The package's modules that ``mod`` imports anywhere in its source (parents' ``__init__`` included),
    and whether it also imports dynamically (then nobody can say what it reaches)."""
    path = module_file(mod, package_dir)
    if path is None:
        return set(), False
    _, found, dynamic = _read(path)
    here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out = set()
    for level, name, names in found:
        if level:
            base = here[:len(here) - (level - 1)]
            target = ".".join(base + ([name] if name else []))
        else:
            target = name
        if target.split(".")[0] != PACKAGE:
            continue
        for n in names or ():
            if module_file(f"{target}.{n}", package_dir) is not None:
                out.update(_with_parents(f"{target}.{n}"))
        out.update(_with_parents(target))
    return {m for m in out if module_file(m, package_dir) is not None}, dynamic


def closure(roots: Iterable[str], package_dir: Path = PACKAGE_DIR) -> set[str] | None:
    """Every module of the package that ``roots`` reach through imports, the roots and their parent packages
    included; None when one of them imports dynamically (the whole package then)."""
    todo = [m for r in roots for m in _with_parents(r) if module_file(m, package_dir) is not None]
    seen: set[str] = set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        found, dynamic = direct_imports(m, package_dir)
        if dynamic:
            return None
        todo.extend(found - seen)
    return seen


def all_modules(package_dir: Path = PACKAGE_DIR) -> set[str]:
    out = set()
    for f in package_dir.rglob("*.py"):
        parts = f.relative_to(package_dir).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        out.add(".".join((PACKAGE, *parts)))
    return out


def code_version(roots: Iterable[str] | None = None, package_dir: Path = PACKAGE_DIR) -> str:
    """SHA-256 over the names and contents of the modules ``roots`` reach (every module of the package when
    ``roots`` is None or empty, or when one of them imports dynamically)."""
    roots = sorted(set(roots or ()))
    mods = (closure(roots, package_dir) if roots else None) or all_modules(package_dir)
    h = hashlib.sha256()
    for m in sorted(mods):
        path = module_file(m, package_dir)
        if path is None:
            continue
        h.update(path.relative_to(package_dir).as_posix().encode() + b"\0" + _read(path)[0].encode() + b"\0")
    return h.hexdigest()


def _in_store(mod: str | None) -> bool:
    return bool(mod) and (mod == STORE or mod.startswith(STORE + "."))


def _ours(mod: str | None) -> bool:
    return bool(mod) and (mod == PACKAGE or mod.startswith(PACKAGE + ".")) and not _in_store(mod)


def roots_for(*fns: Callable | None) -> list[str]:
    """The package's modules a computation runs in: the one that asks the store (the innermost frame of the
    calling stack outside the store) and those where ``fns`` (the computation itself) are defined. Who called
    that function does not count, so a result asked for from two chapters has one key. Empty when none is the
    package's (a function defined in a notebook or a test): the caller then keys by the whole package."""
    mods = {getattr(f, "__module__", None) for f in fns if f is not None}
    frame = sys._getframe(1)
    while frame is not None and _in_store(frame.f_globals.get("__name__")):
        frame = frame.f_back
    if frame is not None:
        mods.add(frame.f_globals.get("__name__"))
    return sorted(m for m in mods if _ours(m))


def notebook_roots(sources: Iterable[str]) -> list[str] | None:
    """The package's modules a notebook imports, read from its code cells' ``import`` statements; None when a
    cell does not parse or imports the package dynamically (then the whole package counts)."""
    mods = set()
    for src in sources:
        lines = [ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!"))]  # IPython magics
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError:
            return None
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
                if any(a.name.split(".")[0] == "importlib" for a in node.names):
                    return None
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == PACKAGE:
                mods.add(node.module)
                mods.update(f"{node.module}.{a.name}" for a in node.names
                            if module_file(f"{node.module}.{a.name}") is not None)
    return sorted(m for m in mods if module_file(m) is not None)

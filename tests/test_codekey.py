"""The result cache's code key covers the code a result depends on and nothing else: editing the build tooling
recomputes no point, editing the engine recomputes the points that use it, and a computation the key cannot
place is keyed by the whole package."""
import shutil
from pathlib import Path

import pandas as pd
import pytest

from earlyexit.store import codekey
from earlyexit.store import results as store

PKG = codekey.PACKAGE_DIR
BUILD_TOOLING = ["runner", "pagecheck", "bundle", "sphinxext", "jobs", "profiles", "rerun", "sweep", "handoff",
                 "figures", "plots", "chapter", "provenance"]


def experiments():
    return sorted(f"earlyexit.experiments.{p.stem}" for p in (PKG / "experiments").glob("*.py")
                  if p.stem != "__init__")


@pytest.mark.parametrize("mod", experiments())
def test_an_experiment_reaches_the_engine_but_not_the_build_tooling(mod):
    reach = codekey.closure([mod])
    assert reach is not None and mod in reach
    assert "earlyexit.experiments" in reach and "earlyexit" in reach, "parent packages' __init__ run on import"
    assert not [m for m in reach if m.startswith("earlyexit.book")], sorted(reach)


def test_points_reach_the_engine_loop():
    assert {"earlyexit.engine.loop", "earlyexit.engine.fill", "earlyexit.engine.cache"} <= codekey.closure(
        ["earlyexit.experiments.points"])


def _copy(tmp_path) -> Path:
    dst = tmp_path / "earlyexit"
    shutil.copytree(PKG, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _edit(path: Path, text: str = "\n# an edited comment\n") -> None:
    path.write_text(path.read_text() + text)


@pytest.mark.parametrize("tool", BUILD_TOOLING)
def test_editing_the_build_tooling_keeps_every_experiments_key(tmp_path, tool):
    pkg = _copy(tmp_path)
    before = {m: codekey.code_version([m], pkg) for m in experiments()}
    whole = codekey.code_version(None, pkg)
    _edit(pkg / "book" / f"{tool}.py")
    assert {m: codekey.code_version([m], pkg) for m in experiments()} == before
    assert codekey.code_version(None, pkg) != whole, "the whole package's version does see it"


def test_editing_the_engine_changes_the_keys_of_what_uses_it(tmp_path):
    pkg = _copy(tmp_path)
    mods = ["earlyexit.experiments.points", "earlyexit.experiments.timing", "earlyexit.experiments.costmodel"]
    before = {m: codekey.code_version([m], pkg) for m in mods}
    _edit(pkg / "engine" / "fill.py", '\n"""a docstring edited"""\n')
    after = {m: codekey.code_version([m], pkg) for m in mods}
    assert all(after[m] != before[m] for m in mods)


def test_an_import_inside_a_function_counts_and_a_dynamic_one_means_everything(tmp_path):
    pkg = tmp_path / "earlyexit"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from . import b\n    return b.x\n")
    (pkg / "sub" / "b.py").write_text("x = 1\n")
    (pkg / "sub" / "c.py").write_text("y = 2\n")
    assert codekey.closure(["earlyexit.sub.a"], pkg) == {"earlyexit", "earlyexit.sub", "earlyexit.sub.a",
                                                        "earlyexit.sub.b"}
    v = codekey.code_version(["earlyexit.sub.a"], pkg)
    _edit(pkg / "sub" / "c.py")
    assert codekey.code_version(["earlyexit.sub.a"], pkg) == v, "c is out of a's reach"
    _edit(pkg / "sub" / "b.py")
    assert codekey.code_version(["earlyexit.sub.a"], pkg) != v, "b is imported inside a function"
    (pkg / "sub" / "a.py").write_text("import importlib\nm = importlib.import_module('earlyexit.sub.c')\n")
    assert codekey.closure(["earlyexit.sub.a"], pkg) is None
    assert codekey.code_version(["earlyexit.sub.a"], pkg) == codekey.code_version(None, pkg)


def test_notebook_roots_read_the_imports_of_code_cells():
    cells = ["%matplotlib inline\nfrom earlyexit.book import chapter, figures\nimport numpy as np",
             "from earlyexit.experiments import points\nfrom earlyexit.engine.cache import HOLE"]
    roots = codekey.notebook_roots(cells)
    assert roots == ["earlyexit.book", "earlyexit.book.chapter", "earlyexit.book.figures",
                     "earlyexit.engine.cache", "earlyexit.experiments", "earlyexit.experiments.points"]
    assert codekey.notebook_roots(["import importlib; importlib.import_module('earlyexit.book')"]) is None
    assert codekey.notebook_roots(["this is not python ("]) is None


def _in_module(name: str, src: str, **env) -> dict:
    """Run ``src`` as if it were code of module ``name`` (its frames carry that name), return its namespace."""
    ns = {"__name__": name, **env}
    exec(compile(src, f"<{name}>", "exec"), ns)
    return ns


def test_the_key_names_the_asking_module_whoever_calls_it(tmp_path, monkeypatch):
    """A result asked for by the same function has one key, whether a test, a chapter or another experiment
    calls that function; a computation defined outside the package is keyed by the whole package."""
    monkeypatch.setattr("earlyexit.paths.CACHE", tmp_path)
    calls = []
    asker = _in_module("earlyexit.experiments.metrics",
                       "def ask(x):\n    return store.cached('asked', {'x': x}, lambda: calls.append(x) or {'x': x})\n",
                       store=store, calls=calls)["ask"]
    via = _in_module("earlyexit.experiments.compare", "def via(x):\n    return ask(x)\n", ask=asker)["via"]
    asker(1)
    via(1)
    assert calls == [1], "asked directly and through another experiment: computed once"
    meta = next((tmp_path / "asked").glob("*.json")).read_text()
    assert '"earlyexit.experiments.metrics"' in meta and "earlyexit.experiments.compare" not in meta
    assert codekey.code_version(["earlyexit.experiments.metrics"]) in meta

    def local():
        return pd.DataFrame({"a": [1]})

    store.cached("local", {}, local)
    meta = next((tmp_path / "local").glob("*.json")).read_text()
    assert '"code_roots": []' in meta and codekey.code_version() in meta


def _package_fn():
    def fn(x):
        return {"total": sum(x)}
    fn.__module__ = "earlyexit.experiments.metrics"
    return fn


def test_a_sweep_is_keyed_by_its_function_and_entries_skip_changed_code(tmp_path, monkeypatch):
    monkeypatch.setattr("earlyexit.paths.CACHE", tmp_path)
    store.sweep("pkg", [{"x": [1.0, 2.0]}], _package_fn(), add_params=False)
    meta = next((tmp_path / "pkg").glob("*.json")).read_text()
    assert "earlyexit.experiments.metrics" in meta
    assert len(list(store.entries("pkg"))) == 1, "an entry whose code is unchanged is current"
    monkeypatch.setattr(codekey, "code_version", lambda roots=None, package_dir=PKG: "another version")
    assert list(store.entries("pkg")) == []
    assert len(list(store.entries("pkg", current_code=False))) == 1

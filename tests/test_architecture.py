"""The package's shape: three layers over a foundation, imports that only run downward, small modules, and an
engine that asks its rules and strategies through their interfaces rather than their classes."""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "earlyexit"
# Lower number = lower layer. A module may import from its own layer or any lower one.
LAYERS = {"foundation": 0, "engine": 1, "training": 2, "book": 3, "cli": 4}
MAX_LINES = 420  # "about 400"


def layer_of(module: str) -> str:
    """'earlyexit.engine.loop' -> 'engine'; the package's own top-level files are the foundation."""
    parts = module.split(".")
    if parts[1:2] and parts[1] in ("engine", "training", "book"):
        return parts[1]
    if parts[1:2] == ["__main__"]:
        return "cli"
    return "foundation"


def modules():
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        yield name, f


def imports_of(name: str, path: Path):
    """Every earlyexit module ``name`` imports (absolute or relative), with its line."""
    tree = ast.parse(path.read_text())
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("earlyexit"):
                # "from . import points" names a module too
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    yield (sub if (PKG.parent / (sub.replace(".", "/") + ".py")).exists()
                           or (PKG.parent / sub.replace(".", "/")).is_dir() else target), node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("earlyexit"):
                    yield alias.name, node.lineno


def test_imports_only_run_downward():
    wrong = []
    for name, path in modules():
        here = LAYERS[layer_of(name)]
        for target, line in imports_of(name, path):
            if LAYERS[layer_of(target)] > here:
                wrong.append(f"{path.relative_to(PKG)}:{line} ({layer_of(name)}) imports {target} ({layer_of(target)})")
    assert not wrong, "imports that run up a layer:\n" + "\n".join(wrong)


def test_the_layer_check_can_fail(tmp_path):
    """The checker sees an upward import (engine -> book) when there is one."""
    f = tmp_path / "earlyexit" / "engine" / "bad.py"
    f.parent.mkdir(parents=True)
    f.write_text("from ..book import store\nfrom earlyexit.training import loop\n")
    got = [t for t, _ in imports_of("earlyexit.engine.bad", f)]
    assert {layer_of(t) for t in got} == {"book", "training"}


@pytest.mark.parametrize("name, path", list(modules()), ids=lambda x: str(x).rsplit("src/", 1)[-1])
def test_modules_are_small(name, path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{name} has {n} lines; split it by concern (at most about 400)"


def test_engine_never_asks_a_rule_or_strategy_for_its_class():
    for path in (PKG / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                arg = ast.unparse(node.args[0])
                assert not any(w in arg for w in ("rule", "strategy")), f"{path.name}: isinstance({arg}, ...)"
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "hasattr":
                assert "strategy" not in ast.unparse(node.args[0]), f"{path.name}: hasattr on a strategy"


def test_every_strategy_hook_the_loop_calls_is_declared():
    from earlyexit.engine.fill import REGISTRY, Strategy

    hooks = {"reset", "on_exit", "before_layer", "after_layer", "pending", "flush"}
    assert hooks <= set(vars(Strategy)), hooks - set(vars(Strategy))
    for cls in REGISTRY.values():
        assert issubclass(cls, Strategy)


def test_every_rule_answers_plan_checks_and_decide():
    from earlyexit.engine.rules import RULES, make_rule

    kw = {"static": {"layer": 3}, "skipdecode": {"e_max": 6, "e_min": 3}, "scripted": {"exits": (2, 3)},
          "classifier": {"classifier": "some-folder"}}
    for name in RULES:
        r = make_rule(name, 6, **kw.get(name, {}))
        assert list(r.plan(2)) and all(0 <= l < 6 for l in r.plan(2))
        assert isinstance(r.checks_at(3, 1), bool)
        assert callable(r.decide)

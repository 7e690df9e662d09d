"""Declared parameters of every notebook, and their validation.

Each executed notebook has one schema here. The runner checks a profile's parameters against it
before any work starts; the notebook checks them again in its first code cell, so that a direct
``papermill -p ...`` run or a hand edit gets the same clear error::

    # first code cell, right after the cell tagged "parameters"
    from earlyexit.book import chapter
    C = chapter.setup("01_kv_cache_invariant", globals())     # calls params.check(...) first

Adding a notebook's schema is a few lines::

    register("05_my_chapter",
             n_prompts=Param(int, 16, "prompts per point", range=(1, 10_000)),
             rule=Param(str, "margin", "exit rule", choices=("margin", "softmax")))

Every schema also holds the COMMON parameters (model, device, dtype, seed, profile), which a
profile's ``common:`` section sets for all notebooks at once.
"""
from __future__ import annotations

import difflib
import math
import types
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping


@dataclass(frozen=True)
class Param:
    """One parameter: its type, default, allowed values and a line of help.

    type     a Python type or a tuple of them (``float`` also accepts an ``int``; ``bool`` is never
             accepted for ``int`` nor ``int`` for ``bool``). ``type(None)`` in the tuple allows None.
    range    (low, high), inclusive; either end may be None. For numbers, and for the items of lists.
    choices  the allowed values (for lists: allowed items). With a range as well, numbers are checked by the
             range and other values by the choices (``threads``: a count, or "auto").
    item     for ``list`` parameters: the type of each item.
    """

    type: type | tuple
    default: Any
    help: str = ""
    range: tuple | None = None
    choices: tuple | None = None
    item: type | tuple | None = None

    def types(self) -> tuple:
        return self.type if isinstance(self.type, tuple) else (self.type,)

    def describe(self) -> str:
        names = "|".join(t.__name__ if t is not type(None) else "None" for t in self.types())
        if self.item is not None:
            names += f"[{getattr(self.item, '__name__', self.item)}]"
        extra = ""
        if self.range is not None:
            extra += f", range [{self.range[0]}, {self.range[1]}]"
        if self.choices is not None:
            extra += f", one of {list(self.choices)}"
        return f"{names}{extra}: {self.help}"


class Params(dict):
    """Validated parameters: a dict that also reads as attributes (``P.model``)."""

    notebook: str | None = None

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no parameter {name!r}; valid: {', '.join(sorted(self))}") from None


@dataclass
class Schema:
    """The declared parameters of one notebook."""

    params: dict[str, Param]
    name: str = ""
    doc: str = ""
    extra: dict = field(default_factory=dict)

    def __contains__(self, key: str) -> bool:
        return key in self.params

    def __iter__(self):
        return iter(self.params)

    def defaults(self) -> Params:
        p = Params({k: v.default for k, v in self.params.items()})
        p.notebook = self.name or None
        return p

    def help(self) -> str:
        width = max(map(len, self.params), default=0)
        return "\n".join(f"  {k:<{width}}  {v.describe()} (default {v.default!r})"
                         for k, v in self.params.items())


# Parameters every notebook takes; a profile's `common:` section may set only these.
COMMON: dict[str, Param] = {
    "model": Param(str, "smollm2-135m", "model spec: 'smollm2-135m' (embedded), a tiny test model "
                   "('tiny-llama', ...), a Hugging Face id or a local path"),
    "device": Param(str, "auto", "where to run", choices=("auto", "cpu", "cuda")),
    "dtype": Param((str, type(None)), None, "weights dtype; None = fp32 on CPU, bf16 on GPU",
                   choices=(None, "float32", "bfloat16", "float16")),
    "seed": Param(int, 0, "seed for every random choice", range=(0, 2**32 - 1)),
    "timing_run_sd": Param(float, 0.012, "run-to-run spread of a paired speed ratio (log-space standard "
                           "deviation) added in quadrature to every speed's 95% interval; 0: the spread over "
                           "prompts only; 0.012 measured on the 2-core CPU, see profiles/cpu.yml", range=(0.0, 0.5)),
    "profile": Param(str, "cpu", "the profile that set these parameters (recorded in provenance)"),
}

SCHEMAS: dict[str, Schema] = {}


def register(notebook: str, doc: str = "", **params: Param) -> Schema:
    """Declare the parameters of ``notebook`` (its file name without .ipynb); COMMON ones are added."""
    clash = sorted(set(params) & set(COMMON))
    if clash:
        raise ValueError(f"{notebook}: {clash} are COMMON parameters; do not redeclare them")
    schema = Schema({**COMMON, **params}, name=notebook, doc=doc)
    SCHEMAS[notebook] = schema
    return schema


def get(notebook: str) -> Schema:
    if notebook not in SCHEMAS:
        raise ValueError(f"no parameter schema for notebook {notebook!r}{suggest(notebook, SCHEMAS)}; "
                         f"known: {', '.join(sorted(SCHEMAS))} (declare one in earlyexit/params.py)")
    return SCHEMAS[notebook]


def suggest(name: str, valid: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest valid name, or ''."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _type_ok(value, types_: tuple) -> bool:
    for t in types_:
        if t is type(None):
            if value is None:
                return True
        elif t is bool:
            if isinstance(value, bool):
                return True
        elif t is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return True
        elif t is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return True
        elif isinstance(value, t):
            return True
    return False


def _value_problems(name: str, p: Param, value) -> list[str]:
    types_ = p.types()
    if not _type_ok(value, types_):
        want = " or ".join("None" if t is type(None) else t.__name__ for t in types_)
        return [f"{name}: expected {want}, got {type(value).__name__} {value!r}"]
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) and p.item is not None else None
    problems = []
    if items is not None:
        item_types = p.item if isinstance(p.item, tuple) else (p.item,)
        for i, v in enumerate(items):
            if not _type_ok(v, item_types):
                want = " or ".join(t.__name__ for t in item_types)
                problems.append(f"{name}[{i}]: expected {want}, got {type(v).__name__} {v!r}")
        if problems:
            return problems
    for v in items if items is not None else [value]:
        where = name if items is None else f"{name} item {v!r}"
        if p.range is not None and isinstance(v, (int, float)):
            lo, hi = p.range
            if isinstance(v, float) and math.isnan(v):
                problems.append(f"{where}: NaN is not allowed")
            elif (lo is not None and v < lo) or (hi is not None and v > hi):
                problems.append(f"{where}: {v!r} is out of range [{lo}, {hi}]")
        numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
        if p.choices is not None and v not in p.choices and not (numeric and p.range is not None):
            problems.append(f"{where}: {v!r} is not one of {list(p.choices)}{suggest(str(v), map(str, p.choices))}")
    return problems


def validate(schema: Schema | str, values: Mapping[str, Any], *, fill_defaults: bool = True) -> Params:
    """Check ``values`` against ``schema``; return them (with defaults filled in) or raise ValueError.

    Every problem is reported in one ValueError: unknown names (with the closest valid name),
    wrong types, values out of range or not among the choices. Floats given as ints are widened.
    """
    if isinstance(schema, str):
        schema = get(schema)
    problems = []
    for k in values:
        if k not in schema.params:
            problems.append(f"unknown parameter {k!r}{suggest(k, schema.params)}")
    out = schema.defaults() if fill_defaults else Params()
    out.notebook = schema.name or None
    for k, v in values.items():
        if k not in schema.params:
            continue
        p = schema.params[k]
        found = _value_problems(k, p, v)
        problems += found
        if not found:
            if float in p.types() and isinstance(v, int) and not isinstance(v, bool) \
                    and int not in p.types():
                v = float(v)
            out[k] = v
    if problems:
        what = f"notebook {schema.name!r}" if schema.name else "parameters"
        raise ValueError(f"invalid parameters for {what}:\n  - " + "\n  - ".join(problems)
                         + f"\nvalid parameters:\n{schema.help()}")
    return out


_PLAIN = (bool, int, float, str, list, tuple, dict, type(None))
_IPYTHON_NAMES = {"In", "Out", "exit", "quit", "get_ipython"}


def check(notebook: str, namespace: Mapping[str, Any]) -> Params:
    """Validate a notebook's parameters from its global namespace.

    Call it in the code cell right after the ``parameters`` cell. It takes the schema's names
    from ``namespace`` (missing ones get their defaults) and treats any other plain-data global
    (number, string, list, dict, None) not starting with ``_`` as an unknown parameter, which
    catches a misspelt ``papermill -p`` name.
    """
    schema = get(notebook)
    values = {}
    for k, v in namespace.items():
        if k.startswith("_") or k in _IPYTHON_NAMES or isinstance(v, Params):
            continue
        if k in schema.params or (isinstance(v, _PLAIN) and not isinstance(v, types.ModuleType)):
            values[k] = v
    return validate(schema, values)

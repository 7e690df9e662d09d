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
    choices  the allowed values (for lists: allowed items).
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
        raise ValueError(f"no parameter schema for notebook {notebook!r}{_suggest(notebook, SCHEMAS)}; "
                         f"known: {', '.join(sorted(SCHEMAS))} (declare one in earlyexit/params.py)")
    return SCHEMAS[notebook]


def _suggest(name: str, valid: Iterable[str]) -> str:
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
        if p.choices is not None and v not in p.choices:
            problems.append(f"{where}: {v!r} is not one of {list(p.choices)}{_suggest(str(v), map(str, p.choices))}")
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
            problems.append(f"unknown parameter {k!r}{_suggest(k, schema.params)}")
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


# ---------------------------------------------------------------------------------------------
# Schemas, one per executed notebook. Keep the defaults cpu-sized: each notebook must run top
# to bottom by hand in Jupyter with them.
# ---------------------------------------------------------------------------------------------

INTRO = register(
    "00_intro",
    doc="The book's first page: the problem in one picture (one prompt's cache under each method).",
    threads=Param(int, 1, "CPU threads for torch (0 = torch's default); on a shared 2-core machine one "
                  "thread is fastest", range=(0, 256)),
    prompt_kind=Param(str, "mix", "evaluation prompts: code, prose, instruction, a '+'-joined subset or mix"),
    n_prompts=Param(int, 12, "size of the evaluation set the prompt is drawn from (the chapters' set)",
                    range=(1, 10_000)),
    max_prompt_tokens=Param(int, 96, "longest prompt kept (tokens)", range=(8, 8192)),
    max_new_tokens=Param(int, 32, "tokens generated", range=(2, 8192)),
    map_prompt=Param(int, 11, "index of the prompt drawn (clipped to the set)", range=(0, 10_000)),
    warmup=Param(int, 1, "SkipDecode's warm-up layers (always run)", range=(0, 1024)),
    skip_e_min=Param(int, 0, "SkipDecode's final budget e_min (0 = the one whose mean depth is closest "
                     "to the oracle exits')", range=(0, 1024)),
)

KV_CACHE_INVARIANT = register(
    "01_kv_cache_invariant",
    doc="Why every layer keeps K/V for every token, and how big that cache is.",
    prompt=Param(str, "Explain in two sentences why the sky is blue.",
                 "user message for the greedy generation shown in the chapter"),
    max_new_tokens=Param(int, 40, "tokens generated greedily", range=(1, 4096)),
    measure_lengths=Param(list, [16, 64, 256, 1024], "prompt lengths (tokens) at which the cache is "
                          "measured", item=int, range=(1, 1 << 20)),
    plot_max_tokens=Param(int, 131072, "longest sequence on the cache-size figure", range=(16, 1 << 24)),
    batch=Param(int, 1, "batch size b in the memory formula", range=(1, 4096)),
    cache_dtype_bytes=Param(int, 2, "bytes per cached number for the published models (2 = bf16)",
                            choices=(1, 2, 4)),
)


# --- chapters 02-05: early exit and the holes it leaves (issue 4) ------------------------------
# Sizes shared by the four chapters: the same (prompt set, tokens, rule, strategy, threshold) point
# is computed once and read from the result cache by the others.

def _exit_chapter(**own: Param) -> dict:
    shared = dict(
        threads=Param(int, 1, "CPU threads for torch (0 = torch's default); on a shared 2-core machine one "
                      "thread is fastest", range=(0, 256)),
        prompt_kind=Param(str, "mix", "evaluation prompts: code, prose, instruction, a '+'-joined subset or mix"),
        n_prompts=Param(int, 12, "prompts per point (one batch)", range=(1, 10_000)),
        max_prompt_tokens=Param(int, 96, "longest prompt kept (tokens)", range=(8, 8192)),
        max_new_tokens=Param(int, 32, "tokens generated per prompt", range=(2, 8192)),
        rule=Param(str, "softmax", "confidence exit rule swept", choices=("softmax", "margin", "saturation")),
        min_layer=Param(int, 0, "lowest layer a confidence rule may exit at (0 = half the depth)", range=(0, 1024)),
        thresholds=Param(list, [0.5, 0.9, 0.99, 0.999], "thresholds of the rule swept", item=float,
                         range=(1e-6, 1.0)),
        operating_threshold=Param(float, 0.99, "the threshold used where one point stands for the rule",
                                  range=(1e-6, 1.0)),
        n_boot=Param(int, 2000, "bootstrap resamples for the 95% intervals", range=(100, 1_000_000)),
    )
    return {**shared, **own}


NAIVE_COLLAPSE = register(
    "02_naive_collapse",
    doc="Naive early exit: the holes it leaves in the cache and what they cost.",
    **_exit_chapter(
        strategies=Param(list, ["naive-mask", "naive-undefined"], "the naive fill strategies compared",
                         item=str, choices=("naive-mask", "naive-undefined")),
        static_layers=Param(list, [20, 25, 28], "static-exit baseline layers (those above the depth are dropped)",
                            item=int, range=(1, 1024)),
        scene_prompt=Param(int, 8, "index of the prompt of the scene", range=(0, 10_000)),
        scene_token=Param(int, 3, "generated token that exits early in the scene", range=(1, 8191)),
        scene_exit=Param(int, 0, "its exit layer (0 = half the depth)", range=(0, 1024)),
    ),
)

COPY_FORWARD = register(
    "03_copy_forward",
    doc="CALM's state propagation: copies in the holes, at what cost.",
    **_exit_chapter(
        strategies=Param(list, ["naive-mask", "copy-forward"], "strategies compared in the sweep", item=str,
                         choices=("naive-mask", "naive-undefined", "copy-forward", "lazy-recompute")),
        drift_kind=Param(str, "code+prose", "prompts of the long generations (they continue text)"),
        drift_prompts=Param(int, 4, "prompts of the long generations", range=(1, 10_000)),
        drift_tokens=Param(int, 96, "tokens of the long generations", range=(4, 8192)),
        check_layers=Param(list, [15, 20, 25], "the few layers of the cheap confidence check", item=int,
                           range=(1, 1024)),
        decide_threshold=Param(float, 0.9, "threshold of the decision-cost comparison", range=(1e-6, 1.0)),
        saturation_threshold=Param(float, 0.99, "threshold of the hidden-state saturation rule",
                                   range=(1e-6, 1.0)),
        timing_prompts=Param(int, 3, "prompts timed one by one at batch 1", range=(1, 10_000)),
        timing_repeats=Param(int, 2, "timed runs per prompt (the fastest counts)", range=(1, 100)),
    ),
)

LAZY_RECOMPUTE = register(
    "04_lazy_recompute",
    doc="Lazy recompute: exact output, and what it really saves.",
    **_exit_chapter(
        timing_prompts=Param(int, 3, "prompts timed one by one at batch 1", range=(1, 10_000)),
        timing_repeats=Param(int, 2, "timed runs per prompt (the fastest counts)", range=(1, 100)),
        audit_prompt=Param(int, 0, "prompt whose completed cache is compared with the full model's",
                           range=(0, 10_000)),
    ),
)

SKIPDECODE = register(
    "05_skipdecode",
    doc="SkipDecode: a schedule that never reads a hole, and batches.",
    **_exit_chapter(
        e_mins=Param(list, [10, 15, 20, 25], "SkipDecode's final budgets e_min swept (layers)", item=int,
                     range=(1, 1024)),
        warmup=Param(int, 1, "SkipDecode's warm-up layers (always run)", range=(0, 1024)),
        batch_sizes=Param(list, [1, 4, 8], "batch sizes of the throughput comparison", item=int,
                          range=(1, 4096)),
        batch_e_min=Param(int, 20, "SkipDecode's e_min in the throughput comparison", range=(1, 1024)),
        timing_repeats=Param(int, 2, "timed runs per configuration (the fastest counts)", range=(1, 100)),
    ),
)


# --- chapters 06-07: LayerSkip (issue 5) --------------------------------------------------------
# The training parameters live in chapter 6's schema only; chapters 7 and 8 load the checkpoints that the
# same profile's chapter-6 parameters define (earlyexit.trained.recipes_for_profile).

TRAINING = register(
    "06_training",
    doc="Training for early exit: LayerSkip's recipe, continual pre-training and a from-scratch pair.",
    threads=Param(int, 2, "CPU threads for torch (0 = torch's default); training uses big matrices, so "
                  "both cores help", range=(0, 256)),
    steps=Param(int, 40, "optimizer steps of the continual pre-training of the model", range=(1, 10_000_000)),
    batch_size=Param(int, 4, "sequences per step", range=(1, 65_536)),
    seq_len=Param(int, 256, "tokens per sequence", range=(2, 65_536)),
    lr=Param(float, 1e-4, "peak learning rate (AdamW, cosine decay to a tenth)", range=(1e-8, 0.5)),
    warmup=Param(int, 5, "linear warm-up steps", range=(0, 10_000_000)),
    p_max=Param(float, 0.1, "layer dropout rate of the last layer, p_l = p_max(2^(l/(L-1))-1); in [0, 1)",
                range=(0.0, 0.999999)),
    e_scale=Param(float, 1.0, "early-exit loss scale of the layers below the last", range=(0.0, 1e6)),
    scale=Param(str, "sum", "per-layer early-exit loss scale e(l)", choices=("uniform", "linear", "sum")),
    curriculum=Param(str, "rotational", "which layers get the early-exit loss at a step",
                     choices=("none", "rotational", "gradual")),
    curriculum_param=Param(int, 8, "R of the rotational curriculum (every R-th layer, rotating), or k "
                           "steps per layer of the gradual one", range=(1, 1_000_000)),
    train_embeddings=Param(bool, False, "also train the tied embedding / shared head (False: the head stays "
                           "the pretrained one and the layers learn to be read by it)"),
    checkpoint_every=Param(int, 10, "write a resumable checkpoint every N steps", range=(0, 10_000_000)),
    scratch_config=Param(str, "llama-8x64", "config of the from-scratch pair",
                         choices=("llama-8x64", "llama-8x128", "llama-4x64")),
    scratch_steps=Param(int, 120, "optimizer steps of each from-scratch model", range=(1, 10_000_000)),
    scratch_batch_size=Param(int, 8, "sequences per step, from scratch", range=(1, 65_536)),
    scratch_seq_len=Param(int, 128, "tokens per sequence, from scratch", range=(2, 65_536)),
    scratch_lr=Param(float, 1e-3, "peak learning rate, from scratch", range=(1e-8, 0.5)),
    scratch_rotation=Param(int, 4, "R of the rotational curriculum, from scratch", range=(1, 1_000_000)),
    eval_blocks=Param(int, 8, "held-out blocks for per-layer agreement and perplexity", range=(1, 100_000)),
    eval_seq_len=Param(int, 256, "tokens per held-out block", range=(2, 65_536)),
    n_boot=Param(int, 2000, "bootstrap resamples for the 95% intervals", range=(100, 1_000_000)),
)

SELF_SPECULATIVE = register(
    "07_self_speculative",
    doc="LayerSkip self-speculative decoding on the trained model: lossless, and how fast.",
    **_exit_chapter(
        spec_prompts=Param(int, 4, "prompts of the speed map, each decoded on its own (batch 1)",
                           range=(1, 10_000)),
        exit_layers=Param(list, [15, 20, 25], "draft depths E swept (each in [1, L-1])", item=int,
                          range=(1, 1024)),
        draft_lens=Param(list, [2, 4], "draft lengths d swept (tokens drafted a round)", item=int,
                         range=(1, 64)),
        timing_repeats=Param(int, 1, "timed runs per prompt and method (the fastest counts)", range=(1, 100)),
        peer=Param(bool, True, "also time transformers' generate(assistant_early_exit=E) at every point"),
        strategy_thresholds=Param(list, [0.9, 0.99], "thresholds of the cache strategies re-run on the trained "
                                  "model", item=float, range=(1e-6, 1.0)),
    ),
)

COMPARISON = register(
    "08_comparison",
    doc="Every method on every model: which fix, at what cost; error split; calibrated thresholds.",
    **_exit_chapter(
        static_layers=Param(list, [20, 25, 28], "static-exit layers of the embedded model (scaled for others)",
                            item=int, range=(1, 1024)),
        e_mins=Param(list, [10, 15, 20, 25], "SkipDecode's final budgets (scaled for other depths)", item=int,
                     range=(1, 1024)),
        trained_thresholds=Param(list, [0.9, 0.99], "confidence thresholds on the trained model", item=float,
                                 range=(1e-6, 1.0)),
        scratch_thresholds=Param(list, [0.1, 0.3, 0.5], "confidence thresholds on the small from-scratch models "
                                 "(their predictions are far less peaked)", item=float, range=(1e-6, 1.0)),
        spec_prompts=Param(int, 4, "prompts of the self-speculation points (chapter 7's)", range=(1, 10_000)),
        exit_layers=Param(list, [15, 20, 25], "self-speculation draft depths (chapter 7's; scaled for others)",
                          item=int, range=(1, 1024)),
        draft_lens=Param(list, [2, 4], "self-speculation draft lengths (chapter 7's)", item=int, range=(1, 64)),
        timing_repeats=Param(int, 1, "timed runs of self-speculation (chapter 7's)", range=(1, 100)),
        batch_sizes=Param(list, [1, 8], "batch sizes of the batching argument in the closing section", item=int,
                          range=(1, 4096)),
        target=Param(float, 0.95, "consistency a method must reach for the summary table", range=(0.0, 1.0)),
        models=Param(list, ["released", "trained", "scratch-baseline", "scratch-layerskip"], "models compared",
                     item=str, choices=("released", "trained", "scratch-baseline", "scratch-layerskip")),
        ltt_model=Param(str, "trained", "model whose threshold is calibrated", choices=("released", "trained")),
        ltt_strategy=Param(str, "copy-forward", "cache strategy of the calibrated method",
                           choices=("naive-mask", "naive-undefined", "copy-forward", "lazy-recompute")),
        ltt_prompts=Param(int, 32, "prompts for calibration and test (split in half)", range=(4, 100_000)),
        ltt_thresholds=Param(list, [0.999, 0.99, 0.95, 0.9], "thresholds tested after 1.0, downwards", item=float,
                             range=(1e-6, 1.0)),
        epsilon=Param(float, 0.25, "risk tolerance: mean 1 - ROUGE-L vs the full model allowed", range=(1e-6, 0.999999)),
        delta=Param(float, 0.1, "failure probability of the guarantee", range=(1e-6, 0.999999)),
    ),
)

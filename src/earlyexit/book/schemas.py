"""The declared parameters of every executed notebook, one :func:`~earlyexit.book.params.register` call
each. Keep the defaults cpu-sized: each notebook must run top to bottom by hand in Jupyter with them."""
from __future__ import annotations

from .params import Param, register

THREADS = Param((int, str), "auto", "CPU threads for torch: 'auto' (the cores available to this process, shared "
                "among the workers of a sweep), 0 (torch's default) or a count", range=(0, 256), choices=("auto",))

INTRO = register(
    "00_intro",
    doc="The book's first page: the problem in one picture (one prompt's cache under each method).",
    threads=THREADS,
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

# Exit decisions without the head (chapters 02-04 and 09): state saturation and the learned exit classifier, at
# their operating points; the same parameters give the same classifier, trained once.
DECISIONS = dict(
    saturation_threshold=Param(float, 0.9, "threshold of the saturation rule (cosine of consecutive states)",
                               range=(1e-6, 1.0)),
    clf_prompts=Param(int, 64, "training prompts of the exit classifier (training split)", range=(1, 100_000)),
    clf_tokens=Param(int, 32, "tokens the full model generates per training prompt (labelled positions)",
                     range=(1, 8192)),
    clf_hidden=Param(int, 64, "hidden units of the exit classifier (0: linear)", range=(0, 4096)),
    clf_epochs=Param(int, 30, "training epochs of the exit classifier", range=(1, 10_000)),
    clf_operating=Param(float, 0.8, "the classifier threshold where one point stands for it", range=(1e-6, 1.0)),
)


def _exit_chapter(**own: Param) -> dict:
    shared = dict(
        threads=THREADS,
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
        timing_repeats=Param(int, 2, "timing rounds: the method and full depth in turn on each prompt, the order "
                            "alternating", range=(1, 100)),
        **{k: v for k, v in DECISIONS.items() if k != "saturation_threshold"},
    ),
)

LAZY_RECOMPUTE = register(
    "04_lazy_recompute",
    doc="Lazy recompute: exact output, and what it really saves.",
    **_exit_chapter(
        timing_prompts=Param(int, 3, "prompts timed one by one at batch 1", range=(1, 10_000)),
        timing_repeats=Param(int, 2, "timing rounds: the method and full depth in turn on each prompt, the order "
                            "alternating", range=(1, 100)),
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
        timing_prompts=Param(int, 6, "prompts timed one by one at batch 1", range=(1, 10_000)),
        timing_repeats=Param(int, 2, "timing rounds: the method and full depth in turn on each prompt, the order "
                            "alternating", range=(1, 100)),
        batch_groups=Param(int, 3, "disjoint groups of prompts timed at each batch size above 1 (the interval is "
                           "over groups)", range=(1, 1000)),
    ),
)


# --- chapters 06-07: LayerSkip (issue 5) --------------------------------------------------------
# The training parameters live in chapter 6's schema only; chapters 7 and 8 load the checkpoints that the
# same profile's chapter-6 parameters define (earlyexit.book.handoff.recipes).

TRAINING = register(
    "06_training",
    doc="Training for early exit: LayerSkip's recipe, continual pre-training and a from-scratch pair.",
    threads=THREADS,
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
    amp_cpu=Param(bool, False, "bfloat16 autocast for the continual pre-training runs on a CPU that has AVX-512 "
                  "BF16 or AMX (faster there, losses within noise of float32); a CPU without them, which would "
                  "emulate it more slowly, trains in float32 and the page says so"),
    checkpoint_every=Param(int, 10, "write a resumable checkpoint every N steps (the weights of each are kept: "
                           "acceptance along the run)", range=(0, 10_000_000)),
    variants=Param(list, ["baseline", "distill", "light"], "continual pre-training runs besides LayerSkip's, same "
                   "budget and data: the recipe off (baseline), self-distillation as the early-exit target (distill) "
                   "and LayerSkip's recipe at a lighter dose (light: light_p_max, light_e_scale)",
                   item=str, choices=("baseline", "distill", "light")),
    light_p_max=Param(float, 0.05, "layer dropout rate of the last layer in the lighter-dose run", range=(0.0, 0.999999)),
    light_e_scale=Param(float, 0.02, "early-exit loss scale below the last layer in the lighter-dose run",
                        range=(0.0, 1e6)),
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
        timing_repeats=Param(int, 1, "timed runs per prompt and method of the grids, a screen, back to back with "
                             "full depth (the fastest counts)", range=(1, 100)),
        paired_prompts=Param(int, 6, "prompts of the paired timing of every speed the text quotes (each decoded "
                             "alone)", range=(1, 10_000)),
        paired_rounds=Param(int, 3, "rounds of that timing: the drafter and full depth in turn, the order "
                            "alternating; each decoding step's fastest round counts", range=(1, 100)),
        peer=Param(bool, True, "also time transformers' generate(assistant_early_exit=E) at every point"),
        strategy_thresholds=Param(list, [0.9, 0.99], "thresholds of the cache strategies re-run on the trained "
                                  "model", item=float, range=(1e-6, 1.0)),
        shortlist=Param(int, 8192, "rows of the shortlist draft head: the most frequent tokens of the training "
                        "stream (0: the full vocabulary); the cost model prices a head of that many rows",
                        range=(0, 10_000_000)),
        unit_ctx=Param(int, 96, "keys in the cache when the cost model's unit costs are timed (chapter 9's value: "
                       "both chapters read one measurement)", range=(1, 8192)),
        unit_repeats=Param(int, 5, "timed repeats of each unit cost, the median counts (chapter 9's value)",
                           range=(1, 1000)),
        draft_confidence=Param(float, 0.5, "adaptive draft length: a round stops drafting after a draft whose "
                               "probability is below this", range=(1e-6, 0.999999)),
        skip_layers=Param(list, [4, 8, 12], "training-free drafter: how many layers it leaves out (chosen "
                          "greedily on training text; each in [1, L-2])", item=int, range=(1, 1024)),
        skip_draft_lens=Param(list, [1, 2], "training-free drafter: draft lengths d swept (it drafts over the "
                              "shortlist head when shortlist > 0)", item=int, range=(1, 64)),
        skip_blocks=Param(int, 4, "training-text blocks the layer search scores on", range=(1, 1024)),
        skip_block_tokens=Param(int, 48, "tokens per block of the layer search", range=(2, 65_536)),
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
        target=Param(float, 0.9, "consistency a method must reach for the summary table", range=(0.0, 1.0)),
        models=Param(list, ["released", "trained", "scratch-baseline", "scratch-layerskip"], "models compared",
                     item=str, choices=("released", "trained", "scratch-baseline", "scratch-layerskip")),
        ltt_model=Param(str, "trained", "model whose threshold is calibrated", choices=("released", "trained")),
        ltt_strategy=Param(str, "copy-forward", "cache strategy of the calibrated method",
                           choices=("naive-mask", "naive-undefined", "copy-forward", "lazy-recompute")),
        ltt_prompts=Param(int, 96, "prompts for calibration and test (split in half)", range=(4, 100_000)),
        ltt_thresholds=Param(list, [0.999, 0.99, 0.95, 0.9], "thresholds tested after 1.0, downwards", item=float,
                             range=(1e-6, 1.0)),
        epsilon=Param(float, 0.1, "risk tolerance: mean 1 - ROUGE-L vs the full model allowed", range=(1e-6, 0.999999)),
        delta=Param(float, 0.1, "failure probability of the guarantee", range=(1e-6, 0.999999)),
    ),
)

WHERE_TIME_GOES = register(
    "09_where_time_goes",
    doc="Where the time goes: a measured cost model, exit decisions without the head, and where early exit pays.",
    **_exit_chapter(
        models=Param(list, ["released", "trained"], "models measured", item=str, choices=("released", "trained")),
        **DECISIONS,
        timing_prompts=Param(int, 3, "prompts timed one at a time per method", range=(1, 10_000)),
        timing_repeats=Param(int, 2, "timing rounds: the method and full depth in turn on each prompt, the order "
                            "alternating", range=(1, 100)),
        batch_prompts=Param(int, 3, "prompts timed one at a time per method at batch 1 in the closing batch table",
                            range=(1, 10_000)),
        unit_ctx=Param(int, 96, "keys in the cache when the unit costs are timed", range=(1, 8192)),
        unit_repeats=Param(int, 5, "timed repeats of each unit cost (the median counts)", range=(1, 1000)),
        path_rounds=Param(int, 5, "rounds of the unit costs timed on each weight path in turn (a move's interval "
                          "is over them)", range=(1, 100)),
        shortlist=Param(int, 8192, "rows of the shortlist draft head priced by the cost model", range=(1, 10_000_000)),
        clf_thresholds=Param(list, [0.5, 0.8, 0.95], "classifier thresholds swept", item=float, range=(1e-6, 1.0)),
        spec_exit=Param(int, 25, "self-speculation's draft depth E (the embedded model's; scaled for others)",
                        range=(1, 1024)),
        spec_draft=Param(int, 2, "self-speculation's draft length d", range=(1, 64)),
        ltt_prompts=Param(int, 96, "prompts for calibrating the classifier's threshold and testing it (halves)",
                          range=(4, 100_000)),
        ltt_thresholds=Param(list, [0.99, 0.95, 0.9, 0.8, 0.7, 0.5], "classifier thresholds tested after 1.0, "
                             "downwards", item=float, range=(1e-6, 1.0)),
        epsilon=Param(float, 0.1, "risk tolerance: mean 1 - ROUGE-L vs the full model allowed", range=(1e-6, 0.999999)),
        delta=Param(float, 0.1, "failure probability of the guarantee", range=(1e-6, 0.999999)),
        batch_sizes=Param(list, [1, 8], "batch sizes of the closing comparison", item=int, range=(1, 4096)),
        batch_groups=Param(int, 3, "disjoint groups of prompts timed at each batch size above 1 (the interval is "
                           "over groups)", range=(1, 1000)),
        consistency_floor=Param(float, 0.9, "consistency a method must keep for its speed to count", range=(0.0, 1.0)),
        speed_goal=Param(float, 1.2, "speed-up over full depth the issue sets as a target", range=(0.0, 100.0)),
        error_goal=Param(float, 0.15, "median relative error the cost model must stay under", range=(0.0, 10.0)),
    ),
)


# --- chapter 10: where early exit pays (issue 18) -------------------------------------------------------------
_SHAPE_NAMES = ("SmolLM2-135M", "SmolLM2-360M", "SmolLM2-1.7B", "TinyLlama-1.1B", "Llama-3.2-1B", "Llama-2-7B",
                "Llama-3-8B", "Llama-2-13B", "Llama-2-70B")   # earlyexit.experiments.shapes.SHAPES (tested)

WHERE_IT_PAYS = register(
    "10_where_it_pays",
    doc="Where early exit pays: the cost model at published model shapes, here and on GPUs, against published numbers.",
    threads=THREADS,
    prompt_kind=Param(str, "mix", "evaluation prompts of the trained model's acceptance and oracle exits"),
    n_prompts=Param(int, 12, "prompts for the trained model's acceptance and oracle exits", range=(1, 10_000)),
    max_prompt_tokens=Param(int, 96, "longest prompt kept (tokens)", range=(8, 8192)),
    max_new_tokens=Param(int, 32, "tokens generated per prompt", range=(2, 8192)),
    units_shapes=Param(list, ["SmolLM2-135M", "SmolLM2-360M", "TinyLlama-1.1B", "Llama-3.2-1B", "SmolLM2-1.7B",
                              "Llama-2-7B"], "shapes whose unit costs are timed on this machine (random weights)",
                       item=str, choices=_SHAPE_NAMES),
    units_layers=Param(int, 2, "decoder layers built to time a shape's units (full width; 0 for all of them)",
                       range=(0, 1024)),
    unit_ctx=Param(int, 64, "keys in the cache when a shape's units are timed", range=(1, 8192)),
    unit_repeats=Param(int, 3, "timed repeats of each unit (the median counts)", range=(1, 1000)),
    spec_shapes=Param(list, ["SmolLM2-360M", "TinyLlama-1.1B", "Llama-3.2-1B"], "shapes whose self-speculation is "
                      "timed whole at acceptance 1 and 0 (they must fit in memory)", item=str, choices=_SHAPE_NAMES),
    spec_tokens=Param(int, 16, "tokens generated per prompt when self-speculation is timed at a shape",
                      range=(2, 4096)),
    spec_prompts=Param(int, 2, "random prompts per timed shape", range=(1, 1000)),
    spec_rounds=Param(int, 2, "rounds of the paired timing (method and full depth in turn)", range=(1, 100)),
    map_shapes=Param(list, list(_SHAPE_NAMES), "shapes on the map", item=str, choices=_SHAPE_NAMES),
    exit_fraction=Param(float, 0.25, "the draft depth E as a share of the layers (LayerSkip's: about a quarter)",
                        range=(0.01, 0.99)),
    draft_len=Param(int, 4, "drafts a round d on the map", range=(1, 64)),
    batches=Param(list, [1, 8, 64, 256], "batch sizes priced on the GPUs", item=int, range=(1, 65536)),
    here_batches=Param(list, [1, 8], "batch sizes priced on this machine", item=int, range=(1, 4096)),
    error_goal_here=Param(float, 0.15, "median relative error the cost model must keep against the bounds measured "
                          "here", range=(0.0, 10.0)),
    error_goal_published=Param(float, 0.20, "median relative error against the published speed-ups",
                               range=(0.0, 10.0)),
)

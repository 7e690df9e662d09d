"""The trained models the chapters use: which recipes chapter 6's parameters define, and what the book
measures on them.

    recipes = trained.recipes(p)                          # {"layerskip": Recipe, "scratch-baseline": ..., ...}
    lm = checkpoints.load(recipes["layerskip"])           # trains first if the checkpoint is missing

Which parameters a profile gives chapter 6 is the build's business (:mod:`earlyexit.book.handoff`);
``python -m earlyexit train --profile cpu`` builds every checkpoint of a profile ahead of the book.
"""
from __future__ import annotations

import dataclasses

from ..training.checkpoints import Recipe, heldout_blocks
from ..training.recipe import TrainConfig, native_bf16


# each continual variant, as the fields of LayerSkip's run it changes (from chapter 6's parameters ``g``)
VARIANTS = {"baseline": lambda g: {"recipe": False},
            "distill": lambda g: {"exit_target": "distill"},
            "light": lambda g: {"p_max": g("light_p_max"), "e_scale": g("light_e_scale")}}


def recipes(p) -> dict[str, Recipe]:
    """The checkpoints chapter 6 trains, from its parameters ``p`` (a Params or a dict): ``"layerskip"``
    (continual pre-training of ``p["model"]`` with the recipe), one continual run per entry of
    ``p["variants"]`` at the same budget, data and seed (``"baseline"``: the recipe off; ``"distill"``: the
    exits learn the last layer's detached distribution; ``"light"``: LayerSkip's recipe at a lighter dose,
    ``p["light_p_max"]`` and ``p["light_e_scale"]``), and the from-scratch pair ``"scratch-baseline"`` /
    ``"scratch-layerskip"`` (same data, steps and seed; recipe off / on). Continual runs keep the weights of
    every checkpoint (acceptance along the run) and autocast to bfloat16 on a CPU when ``p["amp_cpu"]`` and the CPU
    has BF16 instructions (:func:`~earlyexit.training.recipe.native_bf16`; float32 elsewhere, where autocast is
    emulated and slower: the recipe's key names the precision that runs)."""
    g = p.__getitem__
    cont = TrainConfig(steps=g("steps"), batch_size=g("batch_size"), seq_len=g("seq_len"), lr=g("lr"),
                       warmup=g("warmup"), p_max=g("p_max"), e_scale=g("e_scale"), scale=g("scale"),
                       curriculum=g("curriculum"), curriculum_param=g("curriculum_param"), seed=g("seed"),
                       train_embeddings=g("train_embeddings"), checkpoint_every=g("checkpoint_every"),
                       keep_checkpoints=1, keep_weights=True,
                       amp_cpu=bool(p.get("amp_cpu", False)) and native_bf16())
    variants = p.get("variants", ())
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown variants {unknown}; valid: {', '.join(VARIANTS)}")
    scratch = dict(steps=g("scratch_steps"), batch_size=g("scratch_batch_size"), seq_len=g("scratch_seq_len"),
                   lr=g("scratch_lr"), warmup=max(1, g("scratch_steps") // 20), p_max=g("p_max"),
                   e_scale=g("e_scale"), scale=g("scale"), curriculum="rotational",
                   curriculum_param=g("scratch_rotation"), seed=g("seed"), weight_decay=0.1,
                   checkpoint_every=g("checkpoint_every"), keep_checkpoints=1)
    base = f"scratch:{g('scratch_config')}"
    out = {"layerskip": Recipe(g("model"), cont, g("seed"))}
    for v in variants:
        out[v] = Recipe(g("model"), dataclasses.replace(cont, **VARIANTS[v](g)), g("seed"))
    return {**out,
            "scratch-baseline": Recipe(base, TrainConfig(**scratch, recipe=False), g("seed")),
            "scratch-layerskip": Recipe(base, TrainConfig(**scratch, recipe=True), g("seed"))}


def continual(recipes: dict[str, Recipe]) -> dict[str, Recipe]:
    """The continual pre-training runs of :func:`recipes` ("layerskip" and its variants, in that order): every
    recipe that starts from the profile's model rather than from scratch."""
    return {k: r for k, r in recipes.items() if not r.scratch}




def precision(cfg: TrainConfig, device_type: str, asked: bool = False) -> str:
    """How a run with ``cfg`` computes on a ``device_type`` ("cpu", "cuda"), in words for the page; ``asked``: the
    profile asked for bfloat16 autocast on the CPU (``amp_cpu``), which :func:`recipes` turns off on a CPU
    without BF16 instructions, and the page says so."""
    if cfg.autocast(device_type):
        return "bfloat16 autocast, weights and optimizer state in float32"
    if asked and device_type == "cpu":
        return ("float32 (the profile asks for bfloat16 autocast, which this CPU, without AVX-512 BF16 or AMX, "
                "would emulate more slowly)")
    return "float32"


def layer_agreement(lm, n_blocks: int, seq_len: int, batch_size: int = 4):
    """Per held-out block and per layer: agreement of the layer's exit (final norm + shared head) with the
    last layer's top-1, and the exit's cross-entropy against the true next token (nats). Cached by the
    model's weights. Columns: block, layer (1-based: layers run), agreement, loss, tokens."""
    import pandas as pd

    from ..training.forward import per_layer_agreement
    from .. import store

    def compute():
        rows = []
        blocks = heldout_blocks(lm.tokenizer, n_blocks, seq_len, batch_size=1)
        for b, ids in enumerate(blocks):
            df = per_layer_agreement(lm.model, ids.to(lm.device))
            for r in df.itertuples():
                rows.append({"block": b, "layer": int(r.layer) + 1, "agreement": float(r.agreement),
                             "loss": float(r.loss), "tokens": int(ids.shape[1] - 1)})
        return pd.DataFrame(rows)

    return store.cached("layer_agreement", {"n_blocks": n_blocks, "seq_len": seq_len}, compute, model=lm)


def recipe_table(before, after: dict, layers, n_boot: int = 2000, seed: int = 0):
    """The continual-pre-training runs side by side, from :func:`layer_agreement` tables: ``before`` (the
    model they all started from) and ``after`` ({name: table}, one per run; a ``"baseline"`` run, the recipe
    off, is the reference for what the recipe itself costs). One row per run: ``ag_<l>`` (agreement of the
    exit after layer ``l`` with the last layer, the acceptance of a one-token draft from there) for each of
    ``layers``, ``ppl`` (the last layer's held-out perplexity), ``ppl_vs_before`` and, with a baseline,
    ``ppl_vs_baseline`` (relative change of the last layer's perplexity, paired over the held-out blocks);
    each with ``_lo``/``_hi`` (95% bootstrap interval over blocks)."""
    import math

    import pandas as pd

    from .metrics import bootstrap_ci

    L = int(before["layer"].max())

    def last(df):
        return df[df.layer == L].set_index("block")["loss"]

    rows = []
    for name, df in after.items():
        r = {"run": name}
        for l in layers:
            v = df[df.layer == l]["agreement"].to_numpy()
            r[f"ag_{l}"], r[f"ag_{l}_lo"], r[f"ag_{l}_hi"] = bootstrap_ci(v, n_boot, seed=seed)
        m, lo, hi = bootstrap_ci(last(df).to_numpy(), n_boot, seed=seed)
        r["ppl"], r["ppl_lo"], r["ppl_hi"] = (math.exp(x) for x in (m, lo, hi))
        refs = {"before": before} | ({"baseline": after["baseline"]} if "baseline" in after else {})
        for ref, rdf in refs.items():
            d = (last(df) - last(rdf)).to_numpy()
            m, lo, hi = bootstrap_ci(d, n_boot, seed=seed)
            r[f"ppl_vs_{ref}"], r[f"ppl_vs_{ref}_lo"], r[f"ppl_vs_{ref}_hi"] = (math.expm1(x) for x in (m, lo, hi))
        rows.append(r)
    return pd.DataFrame(rows)


RUN_NAMES = {"layerskip": "LayerSkip (exits learn the data)", "distill": "self-distillation (exits learn the last layer)",
             "baseline": "recipe off", "light": "LayerSkip, lighter dose"}


SHORT_NAMES = {"layerskip": "LayerSkip (data)", "distill": "self-distillation", "baseline": "recipe off",
               "light": "LayerSkip, lighter"}


def recipe_shown(t, seconds: dict | None = None):
    """:func:`recipe_table` as chapter 6 prints it (``seconds``: {run: seconds a step}; agreement and the
    perplexity changes with their 95% intervals)."""
    import pandas as pd

    from .metrics import ci

    layers = [int(c[3:]) for c in t.columns if c.startswith("ag_") and not c.endswith(("_lo", "_hi"))]
    out = {"run": [SHORT_NAMES.get(r, r) for r in t["run"]]}
    for l in layers:
        out[f"agreement, layer {l}"] = [ci(r, f"ag_{l}") for _, r in t.iterrows()]
    out["last-layer perplexity"] = [f"{r['ppl']:.2f}" for _, r in t.iterrows()]
    out["vs released"] = [ci(r, "ppl_vs_before", "{:+.1%}") for _, r in t.iterrows()]
    if "ppl_vs_baseline" in t:
        out["vs recipe off"] = ["reference" if r["run"] == "baseline" else ci(r, "ppl_vs_baseline", "{:+.1%}")
                                for _, r in t.iterrows()]
    if seconds:
        out["s/step"] = [f"{seconds[r]:.1f}" for r in t["run"]]
    return pd.DataFrame(out)

"""Chapter 10, where early exit pays: the cost model carried to published model shapes and to GPUs.

Tables, the map figure and the sentences whose wording depends on the results. The computations it reads are
cached in :mod:`earlyexit.experiments` (:mod:`~earlyexit.experiments.atshape` times models of the published shapes
here; :mod:`~earlyexit.experiments.roofline` prices the devices that are not here).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..book import figures
from ..experiments import budget, costmodel, roofline, shapes

CALIBRATE_ON = ("hf-blog-layerskip", "Llama-2-7B")     # the published autoregressive time each GPU is fitted on
GPUS = ("a100-80gb", "h100-sxm", "h200")


def exit_layer(L: int, fraction: float) -> int:
    """The draft depth E at ``fraction`` of ``L`` layers (LayerSkip drafts from about a quarter of the depth)."""
    return int(min(L - 1, max(1, round(L * fraction))))


def shapes_table(names) -> pd.DataFrame:
    """The registered shapes as a reader sees them: depth, width, parameters and the head's weights in layers."""
    rows = []
    for n in names:
        s = shapes.shape(n)
        p = s.params()
        rows.append({"model shape": n, "layers": s.layers, "hidden": s.hidden,
                     "parameters": f"{p / 1e9:.2f} B" if p >= 1e9 else f"{p / 1e6:.0f} M",
                     "head / layer (weights)": f"{s.head_to_layer():.2f}", "tied head": "yes" if s.tied_head else "no"})
    return pd.DataFrame(rows)


def units_table(units: dict) -> pd.DataFrame:
    """Per shape measured here ({name: unit table}): one layer over one token, a verification of 5 tokens against
    one, and the head against a layer, in time."""
    rows = []
    for n, u in units.items():
        one = costmodel.predict({"layer:1": 1}, u)["total"]
        five = costmodel.predict({"layer:5": 1}, u)["total"]
        head = costmodel.predict({"head:out:1": 1}, u)["total"]
        rows.append({"model shape": n, "one layer, one token (ms)": f"{one * 1e3:.2f}",
                     "5 tokens / 1 token": f"{five / one:.2f}", "head (ms)": f"{head * 1e3:.2f}",
                     "head / layer (time)": f"{head / one:.1f}"})
    return pd.DataFrame(rows)


def arch(model: str) -> str:
    """The shape name in a published row's model column ("Llama-2-7B (LayerSkip ...)" -> "Llama-2-7B")."""
    return str(model).split(" (")[0]


def gpus(published: pd.DataFrame):
    """Each GPU of :data:`GPUS` with its per-kernel cost fitted on :data:`CALIBRATE_ON`'s autoregressive time (the
    framework's launch cost, taken to be the same on every GPU), and that row."""
    src, name = CALIBRATE_ON
    row = published[(published.source == src) & (published.model.map(arch) == name)].iloc[0]
    dt = row["dtype"] if row["dtype"] in roofline.BYTES else "float16"
    a100 = roofline.calibrate(roofline.device("a100-80gb"), shapes.shape(name), float(row["ar_ms_per_token"]), dt)
    return {g: roofline.device(g).with_launch(a100.launch_us) for g in GPUS}, row


def _gpu_of(hardware: str) -> str | None:
    h = str(hardware).upper()
    if "CPU" in h:
        return None
    if "H100" in h:
        return "h100-sxm"
    if "H200" in h:
        return "h200"
    return "a100-80gb"       # the A100 rows, and the logs whose GPU is not stated (the authors' A100s)


def predictions(published: pd.DataFrame, devices: dict, d_default: int = 6) -> pd.DataFrame:
    """Every published row of a registered shape on a GPU, beside the cost model's prediction on that GPU: the
    speed-up at the row's accepted share of drafts (``predicted``, ``error`` = predicted / published − 1), or,
    where the source gives no acceptance, the share the published speed-up implies (``implied``; at ``d_default``
    drafts a round where no draft length is given). ``ar_pred_ms``: the predicted autoregressive time."""
    rows = []
    for _, r in published.iterrows():
        name, gpu = arch(r["model"]), _gpu_of(r["hardware"])
        if name not in shapes.SHAPES or gpu is None or pd.isna(r["exit_layer"]):
            continue
        s = shapes.shape(name)
        dt = r["dtype"] if r["dtype"] in roofline.BYTES else "float16"
        u = roofline.units(s, devices[gpu], dt)
        E = int(r["exit_layer"])
        d = int(r["draft_len"]) if pd.notna(r["draft_len"]) else d_default
        pred = float(budget.speedup_at_rate(r["acceptance"], s.layers, E, d, u)) if pd.notna(r["acceptance"]) else np.nan
        rows.append({"source": r["source"], "shape": name, "gpu": gpu, "E": E, "d": d,
                     "d_given": pd.notna(r["draft_len"]), "acceptance": r["acceptance"],
                     "published": r["speedup"], "predicted": pred, "error": pred / r["speedup"] - 1,
                     "implied": budget.implied_rate(float(r["speedup"]), s.layers, E, d, u),
                     "ar_ms": r["ar_ms_per_token"],
                     "ar_pred_ms": roofline.step_seconds(s, devices[gpu], dt) * 1e3})
    return pd.DataFrame(rows)


def break_even(units_here: dict, devices: dict, names, fraction: float, d: int, batches=(1, 8, 64),
               here_batches=(1, 8), dtype: str = "bfloat16") -> pd.DataFrame:
    """The accepted share of drafts at which self-speculation breaks even, per shape, device and batch: on this
    machine from its measured units (``units_here``: {name: table}), on the GPUs from the roofline."""
    rows = []
    for n in names:
        s = shapes.shape(n)
        E = exit_layer(s.layers, fraction)
        if n in units_here:
            for B in here_batches:
                rows.append({"shape": n, "device": "this CPU", "batch": B, "E": E, "d": d,
                             "break_even": budget.break_even_rate(s.layers, E, d, units_here[n], batch=B)})
        for g, dev in devices.items():
            for B in batches:
                u = roofline.units(s, dev, dtype, batch=B)
                rows.append({"shape": n, "device": g, "batch": B, "E": E, "d": d,
                             "break_even": budget.break_even_rate(s.layers, E, d, u, batch=B)})
    return pd.DataFrame(rows)


def measured_vs_predicted(bounds: pd.DataFrame, units_here: dict) -> pd.DataFrame:
    """Each measured bound (:func:`earlyexit.experiments.atshape.spec_bounds` rows) beside the cost model's speed-up
    at its measured acceptance, from the units measured at that shape."""
    out = bounds.copy()
    out["predicted"] = [float(budget.speedup_at_rate(r.acceptance, r.L, r.E, r.d, units_here[r.shape]))
                        for r in bounds.itertuples()]
    out["error"] = out["predicted"] / out["ratio"] - 1
    return out


def map_figure(units_here: dict, devices: dict, names, fraction: float, d: int, bounds: pd.DataFrame,
               batches=(1, 8, 64, 256), here_batches=(1, 8), dtype: str = "bfloat16"):
    """Self-speculation's speed-up against the accepted share of drafts, one panel per device: this machine
    (measured units, at ``here_batches``; measured bounds as points) and each GPU (roofline, at the smallest and the
    largest of ``batches``: the break-even table has them all), a colour per shape, a line style per batch; the
    break-even line at 1.0."""
    where = ["this CPU", *devices]
    fig, axes = figures.subplots(1, len(where), width=figures.FULL_WIDTH, aspect=0.9 * len(where) / 2.5,
                                 squeeze=False, sharey=True)
    col = dict(zip(names, figures.palette(len(names))))
    drawn = sorted({*here_batches, min(batches), max(batches)})
    styles = dict(zip(drawn, ["-", "--", "-.", ":", (0, (1, 3)), (0, (5, 1))]))
    rate = np.linspace(0, 1, 41)
    for ax, w in zip(axes[0], where):
        for n in names:
            s = shapes.shape(n)
            E = exit_layer(s.layers, fraction)
            for B in (sorted({min(batches), max(batches)}) if w != "this CPU" else here_batches):
                if w == "this CPU":
                    if n not in units_here:
                        continue
                    u = units_here[n]
                else:
                    u = roofline.units(s, devices[w], dtype, batch=B)
                y = budget.speedup_at_rate(rate, s.layers, E, d, u, batch=B)
                ax.plot(rate, y, color=col[n], ls=styles[B], lw=1.1)
        if w == "this CPU" and len(bounds):
            for r in bounds.itertuples():
                ax.errorbar([r.acceptance], [r.ratio], yerr=[[r.ratio - r.lo], [r.hi - r.ratio]], fmt="o", ms=4,
                            color=col.get(r.shape, "k"), mec="k", mew=0.5, capsize=2)
        ax.axhline(1.0, color="0.3", lw=0.7)
        ax.set(xlabel="accepted share of drafts", title=w if w == "this CPU" else devices[w].name.replace("NVIDIA ", ""),
               xlim=(0, 1))
    axes[0, 0].set_ylabel("speed-up over full depth")
    from matplotlib.lines import Line2D

    key = [Line2D([], [], color=col[n], label=n) for n in names]
    key += [Line2D([], [], color="0.3", ls=styles[B], label=f"batch {B}") for B in styles]
    key += [Line2D([], [], color="0.3", marker="o", ls="none", label="measured here (95% interval)")]
    fig.legend(handles=key, loc="outside lower center", ncols=5)
    return fig


def oracle_bound(ratio, share: float):
    """Token-level exit's best speed-up when every token exits after ``share`` of the layers on average and the head
    is read once: ``(1 + ratio) / (share + ratio)``, with ``ratio`` the head's cost over all the layers' cost."""
    r = np.asarray(ratio, dtype=float)
    return (1 + r) / (share + r)


def oracle_figure(head_share: dict, exits, L: int, batches):
    """Token-level exit's best speed-up (oracle exits, free decisions, exact cache) against the head's cost over all
    the layers' (``head_share``: {shape: that ratio by weights}, marked), at batch 1 (the mean of ``exits``, exit
    layers out of ``L``) and at each larger batch of ``batches`` (a step runs to its batch's deepest exit)."""
    fig, ax = figures.subplots(width=figures.COLUMN_WIDTH * 1.4, aspect=0.8)
    x = np.geomspace(0.003, 1.0, 80)
    cols = figures.palette(len(batches))
    share1 = expected_max_share(exits, L, 1)
    for B, c in zip(sorted(batches), cols):
        share = expected_max_share(exits, L, int(B))
        ax.plot(x, oracle_bound(x, share), color=c, ls="-" if B == 1 else "--", label=f"batch {B}")
    marks = sorted(head_share.items(), key=lambda kv: kv[1])
    for i, (n, h) in enumerate(marks):       # each shape on the batch-1 curve, labels staggered above and below
        y = float(oracle_bound(h, share1))
        ax.plot([h], [y], "o", ms=3, color="k")
        dy = (10 + 9 * (i // 2 % 3)) * (1 if i % 2 == 0 else -1)
        ax.annotate(n, (h, y), xytext=(0, dy), textcoords="offset points", fontsize=5, ha="center",
                    va="bottom" if dy > 0 else "top", arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "0.5"})
    ax.axhline(1.0, color="0.3", lw=0.6)
    ax.set(xscale="log", xlabel="head cost / cost of all layers (weights)", ylabel="best speed-up, oracle exits (×)",
           xlim=(0.003, 1.0))
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def expected_max_share(exits, L: int, batch: int, draws: int = 2000, seed: int = 0) -> float:
    """The mean over steps of the deepest exit among ``batch`` rows drawn from ``exits`` (exit layers, 1..L), as a
    share of ``L``: a batch step runs until its last row exits."""
    e = np.asarray(exits, dtype=float)
    if batch == 1:
        return float(e.mean() / L)
    rng = np.random.default_rng(seed)
    return float(rng.choice(e, (draws, batch)).max(1).mean() / L)


# --------------------------------------------------------------------------------------------------- sentences


def error_sentence(errors, goal: float, noun: str, plural: str | None = None) -> str:
    """The median relative error of ``errors`` against ``goal``, said plainly (``noun``, or ``plural`` for several:
    "measured bound" / "measured bounds"); none to compare said so."""
    e = np.abs(np.asarray([x for x in errors if np.isfinite(x)], dtype=float))
    plural = plural or noun + "s"
    if not len(e):
        return f"No {noun} could be compared."
    med = float(np.median(e))
    verdict = "within" if med < goal else "outside"
    if len(e) == 1:
        return f"For the one {noun} the relative error is {med:.0%}, {verdict} the {goal:.0%} goal."
    return (f"Over {len(e)} {plural} the median relative error is {med:.0%}, {verdict} the {goal:.0%} goal "
            f"(worst {float(e.max()):.0%}).")


def misses_sentence(worst: pd.DataFrame) -> str:
    """The largest misses, one clause per configuration (runs of one configuration joined, never repeated)."""
    if worst.empty:
        return ""
    parts = []
    for (shape, E, d, src), g in worst.groupby(["shape", "E", "d", "source"], sort=False):
        pub = " and ".join(f"{v:.2f}" for v in g["published"])
        pred = " and ".join(f"{v:.2f}" for v in g["predicted"])
        runs = "" if len(g) == 1 else f"{len(g)} runs, "
        parts.append(f"{shape} at E = {E}, d = {d} ({runs}{src}: {pub} published, {pred} predicted)")
    return ("The largest miss is " if len(parts) == 1 and len(worst) == 1 else "The largest misses are ") + \
        "; ".join(parts) + "."


def trained_sentence(rate: float, be: float, name: str, E: int, d: int) -> str:
    """How far the book's trained model's accepted share is from its break-even on this machine."""
    if not np.isfinite(be):
        return (f"On this machine even every draft accepted would not make self-speculation from layer {E} with "
                f"{d} drafts pay for {name}; its trained model accepts {rate:.2f} of them.")
    if rate >= be:
        return (f"{name}'s trained model accepts {rate:.2f} of its drafts from layer {E} ({d} a round), above the "
                f"{be:.2f} at which self-speculation breaks even on this machine.")
    return (f"{name}'s trained model accepts {rate:.2f} of its drafts from layer {E} ({d} a round); self-speculation "
            f"breaks even on this machine only at {be:.2f}, {be - rate:.2f} more.")


def batch_sentence(be: pd.DataFrame, device: str) -> str:
    """Where batching erases the saving on ``device``: the break-even share at batch 1 and at the largest batch,
    over the shapes (median), or that no acceptance pays at that batch."""
    g = be[be.device == device]
    if g.empty:
        return ""
    b1, bmax = int(g.batch.min()), int(g.batch.max())
    lo, hi = g[g.batch == b1]["break_even"], g[g.batch == bmax]["break_even"]
    never = int(hi.isna().sum())
    name = "this CPU" if device == "this CPU" else roofline.device(device).name
    head = (f"On {name} self-speculation breaks even at a median accepted share of {lo.median():.2f} at batch "
            f"{b1}")
    if never == len(hi):
        return head + f"; at batch {bmax} no acceptance makes it pay for any shape."
    tail = f" and {hi.median():.2f} at batch {bmax}"
    if never:
        tail += f", where for {never} of {len(hi)} shapes no acceptance does"
    return head + tail + "."


# ------------------------------------------------------------------------------------- the chapter's tables, notes

def published(path=None) -> pd.DataFrame:
    """The published self-speculation measurements (data/published/self_speculation.csv, sources in each row)."""
    from .. import paths

    return pd.read_csv(path or paths.REPO_ROOT / "data" / "published" / "self_speculation.csv")


def units_notes(ut: pd.DataFrame) -> dict:
    """The spread of :func:`units_table` over the shapes timed here."""
    five = ut["5 tokens / 1 token"].astype(float)
    head = ut["head / layer (time)"].astype(float)
    return {"five_over_one_lo": float(five.min()), "five_over_one_hi": float(five.max()),
            "head_time_lo": float(head.min()), "head_time_hi": float(head.max())}


def bounds_table(mvp: pd.DataFrame) -> pd.DataFrame:
    """The measured bounds as a reader sees them: speed-up with its interval, the prediction, the error."""
    return pd.DataFrame({
        "model shape": mvp["shape"], "drafts": mvp["construction"].map({"accepting": "all accepted",
                                                                        "rejecting": "rejected"}),
        "E of L": [f"{e} of {L}" for e, L in zip(mvp["E"], mvp["L"])],
        "accepted": mvp["acceptance"].map(lambda v: f"{v:.2f}"),
        "speed-up [95%]": [f"{r:.2f} [{lo:.2f}, {hi:.2f}]" for r, lo, hi in
                                    zip(mvp["ratio"], mvp["lo"], mvp["hi"])],
        "predicted": mvp["predicted"].map(lambda v: f"{v:.2f}"),
        "error": mvp["error"].map(lambda v: f"{v:+.0%}"),
        "lossless": mvp["lossless"].map(lambda v: "yes" if v else "NO")})


def bounds_notes(mvp: pd.DataFrame, goal: float) -> dict:
    """The measured bounds' agreement with the cost model, in a sentence."""
    s = error_sentence(mvp["error"], goal, "measured bound")
    acc = mvp[mvp.construction == "accepting"]
    best = acc.loc[acc["ratio"].idxmax()] if len(acc) else None
    if best is not None:
        s += (f" With every draft accepted the largest measured speed-up is {best['ratio']:.2f} "
              f"[{best['lo']:.2f}, {best['hi']:.2f}] ({best['shape']}); with drafts rejected every shape runs slower "
              f"than full depth, as it must.") if (mvp[mvp.construction == "rejecting"]["hi"] < 1).all() else (
              f" With every draft accepted the largest measured speed-up is {best['ratio']:.2f} "
              f"[{best['lo']:.2f}, {best['hi']:.2f}] ({best['shape']}).")
    return {"here_error": s, "here_median": float(np.median(np.abs(mvp["error"]))) if len(mvp) else float("nan")}


def published_notes(preds: pd.DataFrame, devices: dict, calib: pd.Series, goal: float) -> dict:
    """The calibration and the prediction error against the published speed-ups, with the worst misses named."""
    with_acc = preds[preds["acceptance"].notna()]
    err = with_acc["error"].abs()
    med = float(err.median()) if len(err) else float("nan")
    worst = with_acc.loc[err.nlargest(2).index] if len(err) else with_acc
    misses = misses_sentence(worst)
    if misses:
        long_d = with_acc[with_acc.d >= 12]
        misses += (f" The model over-predicts most where a round drafts {int(long_d.d.max())} tokens: it charges a "
                   f"draft the kernels of one layer pass, where the published implementations also pay for each "
                   f"draft token's own host work (sampling, the early-exit head, bookkeeping), which the single "
                   f"fitted per-kernel cost spreads evenly." if len(long_d) else
                   " The per-kernel cost is fitted once; host work that grows with the drafts is not in it.")
    return {"pub_median_pct": f"{med:.0%}", "pub_median": med, "pub_goal_pct": f"{goal:.0%}",
            "pub_error": error_sentence(with_acc["error"], goal, "published speed-up with an accepted share",
                                        "published speed-ups with an accepted share"),
            "pub_misses": misses, "launch_us": float(devices["a100-80gb"].launch_us),
            "calib_what": f"{calib['model'].split(' (')[0]} on one A100 ({calib['source']})",
            "calib_ms": float(calib["ar_ms_per_token"])}


def published_figure(preds: pd.DataFrame, goal: float = 0.2):
    """Published speed-up against predicted, one marker per source; dashed: ±``goal``."""
    fig, ax = figures.subplots(width=figures.COLUMN_WIDTH * 1.3, aspect=0.8)
    p = preds[preds["acceptance"].notna()]
    srcs = list(dict.fromkeys(p["source"]))
    for s_, c, m in zip(srcs, figures.palette(len(srcs)), "os^D"):
        g = p[p.source == s_]
        ax.scatter(g["published"], g["predicted"], color=c, marker=m, s=14, label=s_, lw=0)
    lo, hi = 0.8, max(2.6, float(p[["published", "predicted"]].max().max()) * 1.05) if len(p) else 2.6
    ax.plot([lo, hi], [lo, hi], color="0.3", lw=0.7)
    for f in (1 - goal, 1 + goal):
        ax.plot([lo, hi], [lo * f, hi * f], color="0.6", lw=0.5, ls="--")
    ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="published speed-up (×)", ylabel="predicted speed-up (×)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=6)
    return fig


def map_notes(be: pd.DataFrame) -> dict:
    """The break-even shares in two sentences: this machine, and the GPUs."""
    here = be[be.device == "this CPU"]
    if len(here):
        b1 = here[here.batch == here.batch.min()]["break_even"]
        B = int(here.batch.min())
        lo, hi = float(b1.min()), float(b1.max())
        where = (f"at an accepted share of {lo:.2f}" if round(lo, 2) == round(hi, 2)
                 else f"at an accepted share between {lo:.2f} and {hi:.2f}")
        n = here["shape"].nunique()
        s_here = (f"On this machine self-speculation breaks even {where} at batch {B}, "
                  + (f"across the {n} shapes timed here." if n > 1 else "for the shape timed here."))
    else:
        s_here = ""
    return {"map_here": s_here, "map_gpu": " ".join(batch_sentence(be, g) for g in GPUS if (be.device == g).any())}


def head_share_of(config) -> float:
    """The head's weights over all the decoder layers' weights, for a transformers model ``config``."""
    from types import SimpleNamespace

    heads = config.num_attention_heads
    layer = SimpleNamespace(hidden=config.hidden_size, heads=heads, intermediate=config.intermediate_size,
                            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads)
    return config.vocab_size * config.hidden_size / (config.num_hidden_layers * roofline.layer_params(layer))


def oracle_notes(exits, L: int, head_share: float, batches) -> dict:
    """The trained model's mean oracle exit (share of depth), the largest batch's deepest exit, and the bounds at
    its ``head_share`` (:func:`head_share_of`)."""
    share = expected_max_share(exits, L, 1)
    B = int(max(batches))
    bshare = expected_max_share(exits, L, B)
    h = head_share
    b1, bB = float(oracle_bound(h, share)), float(oracle_bound(h, bshare))
    sentence = (f"At batch one the bound is {b1:.2f} for this book's model; at batch {B} it is {bB:.2f}"
                + (": batching erases the saving." if bB < 1.05 else "."))
    return {"oracle_share": share, "pays_batch_hi": B, "batch_hi_share": bshare, "batch_hi_bound": bB,
            "batch_sentence": sentence, "claim_batch": (
                f"Token-level exit is bounded at batch one by its head ({b1:.2f} times full depth at best, with "
                f"oracle exits, on this book's model) and at batch {B} by the deepest exit of the batch "
                f"({bB:.2f}).")}


def trained_notes(agree: pd.DataFrame, E: int, d: int, units_smol, L: int, name: str) -> dict:
    """The trained model's accepted share at E (agreement of a one-token draft from E with the last layer, along
    its own output) against the break-even on this machine."""
    rate = float(agree[agree.layer == E]["agreement"].mean()) if (agree.layer == E).any() else float("nan")
    be = budget.break_even_rate(L, E, d, units_smol) if units_smol is not None else float("nan")
    return {"trained_rate": rate, "trained_be": be, "trained_E": E,
            "claim_trained": trained_sentence(rate, be, name, E, d) if np.isfinite(rate) else ""}

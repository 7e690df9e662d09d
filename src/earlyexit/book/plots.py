"""Figures and tables shared by several chapters: trade-off curves with intervals, the cache's provenance map,
legends kept off the data, the book's strong colour-blind-safe colours, and tables as a reader sees them (readable
headers with units, no index, no NaN)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..engine.cache import COMPUTED, COPIED, HOLE, PAD, RECOMPUTED, STATE_NAMES
from ..experiments import compare
from .figures import palette


def plot_tradeoff(ax, summ: pd.DataFrame, x: str = "layers", y: str = "rouge_full", hue: str = "strategy",
                  colors: dict | None = None, markers: dict | None = None, connect: bool = True, labels: dict | None = None):
    """Mean ± 95% bootstrap interval (both axes) of ``y`` against ``x`` per group of ``hue``; points of a
    group joined in the order of ``x``. ``summ`` comes from :func:`summary`."""
    groups = list(dict.fromkeys(summ[hue]))
    colors = colors or dict(zip(groups, palette(max(len(groups), 1))))
    for g in groups:
        d = summ[summ[hue] == g].sort_values(x)
        c = colors.get(g)
        mk = (markers or {}).get(g, "o")
        ax.errorbar(d[x], d[y], xerr=[d[x] - d[f"{x}_lo"], d[f"{x}_hi"] - d[x]],
                    yerr=[d[y] - d[f"{y}_lo"], d[f"{y}_hi"] - d[y]], fmt=mk + ("-" if connect else ""),
                    color=c, ms=3.5, lw=1.0, elinewidth=0.6, capsize=1.5, label=(labels or {}).get(g, g))
    return ax


def state_colors() -> dict:
    """One colour-blind-safe colour per cache state (holes white, the 'nothing' colour)."""
    pal = palette(8)
    return {COMPUTED: pal[0], COPIED: pal[1], RECOMPUTED: pal[2], HOLE: (1.0, 1.0, 1.0), PAD: (0.85, 0.85, 0.85)}


def draw_provenance(ax, frame: pd.DataFrame, title: str | None = None, legend: bool = True,
                    states=(COMPUTED, COPIED, RECOMPUTED, HOLE)):
    """Draw a provenance map (from :func:`provenance_map_frame`) as a heatmap, layer × position."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    m = frame.pivot(index="layer", columns="position", values="state")
    cols = state_colors()
    cmap = ListedColormap([cols[s] for s in range(5)])
    x = m.columns.to_numpy()
    y = m.index.to_numpy()
    ax.pcolormesh(np.append(x, x[-1] + 1) - 0.5, np.append(y, y[-1] + 1) - 0.5, m.to_numpy(), cmap=cmap,
                  vmin=-0.5, vmax=4.5, edgecolors=(0.8, 0.8, 0.8), linewidth=0.1)
    ax.axvline(-0.5, color="black", lw=0.8)
    ax.set(xlabel="cache column (0 = first generated token's input)", ylabel="layer", xlim=(x[0] - 0.5, x[-1] + 0.5),
           ylim=(y[0] - 0.5, y[-1] + 0.5))
    if title:
        ax.set_title(title)
    if legend:
        ax.legend(handles=[Patch(facecolor=cols[s], edgecolor="0.5", lw=0.4, label=STATE_NAMES[s]) for s in states],
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return ax


# --------------------------------------------------------------------------- colours and legends

# Okabe and Ito's colour-blind-safe set without its yellow, too pale on white: strong enough to tell seven series apart
OKABE_ITO = {"blue": "#0072B2", "vermillion": "#D55E00", "green": "#009E73", "orange": "#E69F00",
             "purple": "#CC79A7", "sky": "#56B4E9", "black": "#000000"}
# one colour per cache, the same in every chapter's figures that use them
CACHE_COLORS = {"naive-mask": OKABE_ITO["vermillion"], "naive-undefined": OKABE_ITO["purple"],
                "copy-forward": OKABE_ITO["orange"], "lazy-recompute": OKABE_ITO["blue"],
                "eager-recompute": OKABE_ITO["green"]}


def method_style(m: str) -> dict:
    """How a figure of every method (chapter 8's Pareto figure) draws method ``m``: colour its cache
    (:data:`CACHE_COLORS`), marker and line its family (circles and solid lines the confidence rule, plus signs and
    dashes the exit classifier), open markers the bounds."""
    if m in compare.FILL or m in compare.CLASSIFIED:
        rule = m in compare.FILL
        return {"color": CACHE_COLORS[m.split(" / ")[-1]], "fmt": "o-" if rule else "P--", "mfc": None}
    c = {"SkipDecode": OKABE_ITO["sky"], "static exit": "0.45"}.get(m, "black")
    return {"color": c, "fmt": {"SkipDecode": "D-", "static exit": "s", "oracle exits": "^"}.get(m, "*"),
            "mfc": "white" if m in compare.BOUNDS else None}


def method_points(ax, g: pd.DataFrame, x: str, m: str, **kw):
    """Method ``m``'s points ``g`` (a summary: ``x``, consistency, each with _lo/_hi) as :func:`method_style` draws
    them, with their 95% intervals on both axes."""
    st = method_style(m)
    return ax.errorbar(g[x], g["consistency"], xerr=[g[x] - g[f"{x}_lo"], g[f"{x}_hi"] - g[x]],
                       yerr=[g["consistency"] - g["consistency_lo"], g["consistency_hi"] - g["consistency"]],
                       fmt=st["fmt"], color=st["color"], mfc=st["mfc"] or st["color"], lw=1.1, elinewidth=0.5,
                       capsize=1, ms=7 if m == "self-speculation" else 4, **kw)


def legend_below(fig, axes=None, *, ncols: int | None = None, loc: str = "outside lower center", **kw):
    """One legend for the entries of ``axes`` (every panel of ``fig`` by default; each label once) outside the
    panels, below them (``loc``: any of matplotlib's "outside ..." places): never over the data."""
    entries = {}
    for ax in axes if axes is not None else fig.axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab and not lab.startswith("_"):
                entries.setdefault(lab, h)
    if not entries:
        return None
    return fig.legend(list(entries.values()), list(entries), loc=loc, ncols=ncols or min(len(entries), 3), **kw)


# --------------------------------------------------------------------------- tables as a reader sees them


def table(df: pd.DataFrame, columns: dict | None = None, formats: dict | None = None, *, digits: int = 2,
          na: str = "n/a", caption: str | None = None, intervals: dict | None = None):
    """``df`` as a page shows it (a pandas Styler): the ``columns`` named ({column or index level: readable header
    with its unit}, in that order; every column when None), no index, numbers at ``digits`` decimals unless
    ``formats`` ({column: format string or function}) says otherwise, a missing value written ``na`` (say why
    in the header), and ``caption`` above the table. ``intervals`` ({column: format}) shows a column as
    "mean [lo, hi]" from it and its ``<column>_lo``/``<column>_hi``."""
    d = df.reset_index() if any(n is not None for n in df.index.names) else df.reset_index(drop=True)
    d.columns.name = None
    for c, fmt in (intervals or {}).items():
        d[c] = [na if pd.isna(m) else f"{fmt.format(m)} [{fmt.format(lo)}, {fmt.format(hi)}]"
                for m, lo, hi in zip(d[c], d[f"{c}_lo"], d[f"{c}_hi"])]
    if columns:
        d = d[list(columns)].rename(columns=columns)
    styler = d.style.hide(axis="index").format(precision=digits, na_rep=na)
    if formats:
        named = {(columns or {}).get(k, k): f for k, f in formats.items()}
        styler = styler.format(named, subset=list(named), precision=digits, na_rep=na)
    if caption:
        styler = styler.set_caption(caption).set_table_styles(
            [{"selector": "caption", "props": "caption-side: top; text-align: left; font-weight: bold;"}], overwrite=False)
    return styler


def tables(parts, folded: dict | None = None):
    """Several tables (Stylers from :func:`table`, each with its caption) as one output, one after the other, and
    the ``folded`` ones ({summary line: Styler}) one click away: what a page shows where one long table would not
    fit. Returns an IPython HTML object (display it, or glue it)."""
    from IPython.display import HTML

    html = "".join(t.to_html() for t in parts)
    html += "".join(f"<details><summary>{summary}</summary>{t.to_html()}</details>"
                    for summary, t in (folded or {}).items())
    return HTML(html)


def split_by(df: pd.DataFrame, column: str, **kw):
    """``df`` as one :func:`table` per value of ``column`` (in order of appearance), each captioned with that value:
    where one table would run past about a dozen rows."""
    return tables([table(g.drop(columns=column), caption=str(v), **kw) for v, g in df.groupby(column, sort=False)])


def ltt_table(det: pd.DataFrame):
    """Learn then Test's thresholds in the order it tested them (``det``: its details): the loss on the calibration
    half, the p-value, whether the threshold was accepted and its layers per token."""
    return table(det.assign(accepted=det["accepted"].map({True: "yes", False: "no"})),
                 {"threshold": "threshold λ", "risk_hat": "calibration loss (1 − ROUGE-L vs full)",
                  "n": "calibration prompts", "p_value": "p-value (Hoeffding-Bentkus)", "accepted": "accepted",
                  "layers": "layers / token"}, {"threshold": "{:g}", "p_value": "{:.3g}", "layers": "{:.1f}"})


def summary_tables(tab: pd.DataFrame, controls=("from scratch",)):
    """:func:`~earlyexit.experiments.compare.wide_table`'s table (chapter 8's summary, the front page's headline) as
    the page shows it: the exit rules (one row a cache) and the other methods as two tables, a cell's operating
    point without the cache its row already names, no model column that a family left empty ("not run" where one
    method did not run on a model), and the models whose name starts with one of ``controls`` (the from-scratch
    controls) in a third table, folded one click away."""
    t = tab.set_index("method")
    for m in t.index:   # "softmax 0.99 / lazy-recompute: 0.97 ✓, 0.81×" in the lazy-recompute row -> "softmax 0.99: ..."
        t.loc[m] = t.loc[m].str.replace(f" / {m.split(' / ')[-1]}", "", regex=False)
    ctl = [c for c in t.columns if c.startswith(tuple(controls))]
    rules = t.index.isin([*compare.FILL, *compare.CLASSIFIED])

    def part(rows, cols, caption):
        d = t.loc[rows, cols]
        d = d.loc[(d != "").any(axis=1), (d != "").any(axis=0)].replace("", "not run")
        return table(d.rename(index=lambda m: m.replace("classifier / ", "exit classifier, ")), caption=caption)

    main = [c for c in t.columns if c not in ctl]
    out = [part(rules, main, "Exit rules, one row a cache"), part(~rules, main, "The other methods")]
    return tables(out, {"The from-scratch control models": part(slice(None), ctl, "")} if ctl else None)

"""Figures shared by several chapters: trade-off curves with intervals, and the cache's provenance map."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..engine.cache import COMPUTED, COPIED, HOLE, PAD, RECOMPUTED, STATE_NAMES
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


"""One value per fact: a glue key that two chapters both glue must carry the same value on both pages.

    problems = consistency.check(["02_naive_collapse", "04_lazy_recompute"])   # [] when every shared key agrees

A key names a fact (``head_layers``, ``oracle_exit``); a chapter that quotes another's result glues it under the
same key, read from the same store entry, so the two pages cannot disagree. Figures and their citation notes are
per page (their keys name a figure slot, not a fact) and are left out, as are the keys of :data:`PER_PAGE`, which
state how that page ran.
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import paths


def glued(path: Path) -> dict:
    """{key: the text/plain value} of every glue output of an executed notebook, figures included."""
    out = {}
    for c in json.loads(Path(path).read_text()).get("cells", []):
        for o in c.get("outputs", []):
            md = o.get("metadata", {}).get("scrapbook")
            if md:
                d = o.get("data", {})
                v = d.get(md.get("mime_prefix", "") + "text/plain", d.get("text/plain", ""))
                out[md["name"]] = "".join(v) if isinstance(v, list) else v
    return out


def page_record(path: Path) -> dict:
    """The ``earlyexit`` metadata the runner wrote into an executed page (its parameters, commit, duration...);
    {} when the page is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text()).get("metadata", {}).get("earlyexit", {}) or {}
    except (OSError, ValueError):
        return {}


def pages(folder: Path | None = None) -> list[Path]:
    """The executed pages in ``folder`` (default ``book/generated``), by name: every ``<name>.ipynb`` but the
    runner's ``.<name>.running.ipynb``, the half-written copy of a chapter still executing."""
    folder = Path(folder) if folder is not None else paths.GENERATED
    return sorted(nb for nb in folder.glob("*.ipynb") if not nb.name.startswith("."))


# what a page says of its own run: each page states the CPU threads it ran with, the tokens its runs generate and
# how many prompts and rounds its own timings took (a chapter may time more prompts than another), as a number and
# as the counted phrase that states it ("12 prompts", words.count)
PER_PAGE = frozenset({"threads", "threads_phrase", "n_new", "timing_prompts", "timing_repeats", "timing_prompts_str",
                      "timing_repeats_str"})


def is_figure(key: str, value) -> bool:
    """A glued figure or a figure's citation note: per page, a slot rather than a fact or a sentence."""
    return key.endswith("_cite") or str(value).startswith("<Figure")


def _is_fact(key: str, value: str) -> bool:
    return not (key in PER_PAGE or is_figure(key, value))


def conflicts(pages: dict) -> list[str]:
    """The keys glued on several pages ({page: {key: value}}) with different values, one line each."""
    seen: dict = {}
    for page, values in pages.items():
        for k, v in values.items():
            if _is_fact(k, v):
                seen.setdefault(k, {})[page] = v
    out = []
    for k, by_page in sorted(seen.items()):
        if len(set(by_page.values())) > 1:
            shown = "; ".join(f"{p}: {v[:60]}" for p, v in by_page.items())
            out.append(f"glue key {k!r} has {len(set(by_page.values()))} values across pages ({shown})")
    return out


def check(names, generated: Path | None = None) -> list[str]:
    """:func:`conflicts` over the executed copies of the notebooks ``names`` (those not executed are skipped)."""
    folder = Path(generated) if generated is not None else paths.GENERATED
    return conflicts({n: glued(folder / f"{n}.ipynb") for n in names if (folder / f"{n}.ipynb").exists()})

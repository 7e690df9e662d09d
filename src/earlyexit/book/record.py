"""A build's glued values, kept: each executed page stripped to what :mod:`earlyexit.book.agreement` reads (the
text of every glue output and the runner's record of the page: commit, profile, parameters, software), a few
hundred kilobytes for the whole book, so that a build can be compared with one made on another day, in another
session or on another machine, long after its result store and pages are gone.

    python -m earlyexit.book.record book/generated data/builds/cpu-<commit>      # keep this build's values
    python -m earlyexit.book.agreement data/builds/cpu-<commit> book/generated   # a later build against it

A kept build is a folder of ``<name>.ipynb`` files (valid notebooks with one code cell of glue outputs, so that
every reader of executed pages reads them unchanged) and ``build.json``: the commit, profile, machine and the
time each page was executed (keep a build on the machine that made it: the machine named is the one keeping it).
Figures are kept as their glued text only (no image data).
"""
from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from .consistency import page_record, pages

TEXT = "text/plain"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def stripped(page: Path) -> dict:
    """The notebook ``page`` reduced to its glue outputs' text (one code cell) and its ``earlyexit`` metadata."""
    nb = json.loads(Path(page).read_text())
    outs = []
    for c in nb.get("cells", []):
        for o in c.get("outputs", []):
            md = o.get("metadata", {}).get("scrapbook")
            if not md:
                continue
            prefix = md.get("mime_prefix", "")
            d = o.get("data", {})
            v = d.get(prefix + TEXT, d.get(TEXT, ""))
            outs.append({"output_type": "display_data", "metadata": {"scrapbook": dict(md)},
                         "data": {prefix + TEXT: "".join(v) if isinstance(v, list) else v}})
    return {"nbformat": nb.get("nbformat", 4), "nbformat_minor": nb.get("nbformat_minor", 5),
            "metadata": {"earlyexit": page_record(page)},
            "cells": [{"cell_type": "code", "execution_count": None, "id": "glued", "metadata": {},
                       "source": "", "outputs": outs}]}


def keep(folder: Path, out: Path) -> dict:
    """Write the stripped pages of ``folder`` (executed chapters) and ``build.json`` into ``out``; return the
    manifest. A ValueError, before anything is written, when ``folder`` holds no executed page, when its pages
    come from different commits or profiles (not one build), or when ``out`` already holds pages."""
    found = pages(folder)
    if not found:
        raise ValueError(f"{folder}: no executed pages (<name>.ipynb); run `python -m earlyexit book` first")
    records = {nb.stem: page_record(nb) for nb in found}
    commits = {r.get("git_commit") for r in records.values()}
    profiles = {r.get("profile") for r in records.values()}
    if len(commits) != 1 or len(profiles) != 1:
        raise ValueError(f"{folder}: the pages are not one build (commits {sorted(map(str, commits))}, profiles "
                         f"{sorted(map(str, profiles))}); keep the pages of one commit and one profile")
    out = Path(out)
    if out.is_dir() and pages(out):
        raise ValueError(f"{out} already holds pages; name a new folder")
    out.mkdir(parents=True, exist_ok=True)
    for nb in found:
        (out / nb.name).write_text(json.dumps(stripped(nb), indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    manifest = {"commit": commits.pop(), "profile": profiles.pop(),
                "dirty": any(r.get("git_dirty") for r in records.values()),
                "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(), "platform": platform.platform()},
                "pages": {k: {"executed_utc": r.get("executed_utc"), "duration_s": r.get("duration_s"),
                              "jobs": r.get("jobs")} for k, r in records.items()},
                "kept_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    (out / "build.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args and args[0] in ("-h", "--help") else 2
    try:
        m = keep(Path(args[0]), Path(args[1]))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"kept {len(m['pages'])} pages of commit {m['commit'][:7]} (profile {m['profile']}) in {args[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

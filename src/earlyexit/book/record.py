"""A build's glued values, kept: each executed page stripped to what :mod:`earlyexit.book.agreement` reads (the
text of every glue output and the runner's record of the page: commit, profile, parameters, software), a few
hundred kilobytes for the whole book, so that a build can be compared with one made on another day, in another
session or on another machine, long after its result store and pages are gone.

    python -m earlyexit.book.record book/generated data/builds/cpu-<commit>           # keep this build's values
    python -m earlyexit.book.record compare data/builds/cpu-<commit> book/generated   # a later build against it

A kept build is a folder of ``<name>.ipynb`` files (valid notebooks with one code cell of glue outputs, so that
every reader of executed pages reads them unchanged) and ``build.json``: the commit, profile, machine and the
time each page was executed. Keep a build on the machine that made it: ``build.json`` names the machine that
keeps it (CPU model, its kernel-deciding features, cores, memory), and ``compare`` refuses a kept build of another
machine, since the same code runs other kernels at other speeds there (two sessions of this project drew an AMD EPYC
with AVX-512 and one with AVX2 only, whose cold builds took 1,182 s and 1,719 s
for chapter 6's training alone).
Figures are kept as their glued text only (no image data).
"""
from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from .consistency import glued, page_record, pages

# the CPU features that decide which kernels torch and oneDNN pick (two machines that differ in one of these time
# the same code differently, so their builds' ratios are not one measurement)
FEATURES = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")


def machine() -> dict:
    """This machine as a kept build names it: CPU model, the kernel-deciding CPU features it has
    (:data:`FEATURES`), cores and memory (GiB, rounded)."""
    model, flags, mem = platform.processor() or platform.machine(), set(), None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "model name":
                model = val.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(val.split())
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = round(int(line.split()[1]) / 2 ** 20)
    except (OSError, ValueError):
        pass
    return {"cpu": model, "features": [f for f in FEATURES if f in flags], "cores": os.cpu_count(),
            "memory_gib": mem}


def differences(a: dict, b: dict) -> list[str]:
    """How two machines (:func:`machine`) differ, as phrases ('features avx2 against avx2, avx512f'); [] if alike."""
    out = []
    for k in ("cpu", "features", "cores", "memory_gib"):
        x, y = a.get(k), b.get(k)
        if x != y:
            fmt = (lambda v: ", ".join(v) or "none") if k == "features" else str
            out.append(f"{k.replace('_', ' ')} {fmt(x)} against {fmt(y)}")
    return out


def stripped(page: Path) -> dict:
    """The notebook ``page`` reduced to its glue outputs' text (:func:`~earlyexit.book.consistency.glued`, one code
    cell) and its ``earlyexit`` metadata."""
    nb = json.loads(Path(page).read_text())
    outs = [{"output_type": "display_data", "metadata": {"scrapbook": {"name": k, "mime_prefix": ""}},
             "data": {"text/plain": v}} for k, v in glued(page).items()]
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
                "machine": {**machine(), "platform": platform.platform()},
                "pages": {k: {"executed_utc": r.get("executed_utc"), "duration_s": r.get("duration_s"),
                              "jobs": r.get("jobs")} for k, r in records.items()},
                "kept_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    (out / "build.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def compare(kept: Path, folder: Path, any_machine: bool = False) -> int:
    """``agreement``'s comparison of the kept build ``kept`` with the pages in ``folder`` (built on this machine),
    refused (1, with the differences named) when ``kept`` was made on a machine unlike this one, since a ratio
    timed on another CPU is another measurement; ``any_machine`` compares anyway."""
    from . import agreement

    try:
        made_on = json.loads((Path(kept) / "build.json").read_text())["machine"]
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {kept} is not a kept build (no readable build.json: {e}); make one with "
              f"`python -m earlyexit.book.record book/generated {kept}`", file=sys.stderr)
        return 1
    diff = differences(made_on, machine())
    if diff and not any_machine:
        print(f"error: {kept} was built on another machine ({'; '.join(diff)}); its ratios are not this machine's. "
              "Pass --any-machine to compare anyway", file=sys.stderr)
        return 1
    return agreement.main([str(kept), str(folder)])


USAGE = """usage: python -m earlyexit.book.record PAGES KEPT                     keep the build in PAGES as KEPT
       python -m earlyexit.book.record compare KEPT PAGES [--any-machine]  a build of this machine against KEPT"""


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__ + "\n" + USAGE)
        return 0
    if args[:1] == ["compare"]:
        rest = [a for a in args[1:] if a != "--any-machine"]
        if len(rest) != 2:
            print(USAGE, file=sys.stderr)
            return 2
        return compare(Path(rest[0]), Path(rest[1]), "--any-machine" in args)
    if len(args) != 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        m = keep(Path(args[0]), Path(args[1]))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"kept {len(m['pages'])} pages of commit {m['commit'][:7]} (profile {m['profile']}, "
          f"{m['machine']['cpu']}, {m['machine']['cores']} cores) in {args[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

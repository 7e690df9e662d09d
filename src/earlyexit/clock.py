"""Wall-clock time that is true on an accelerator: CUDA kernels run asynchronously, so a timer read without
waiting for them measures how fast Python queued the work, not the work. :func:`now` waits first."""
from __future__ import annotations

import time


def sync(device=None) -> None:
    """Wait for every kernel queued on ``device`` (a torch.device, its string, or None: nothing to wait for
    on a CPU)."""
    if device is None:
        return
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def now(device=None) -> float:
    """``time.perf_counter()`` after :func:`sync` on ``device``."""
    sync(device)
    return time.perf_counter()

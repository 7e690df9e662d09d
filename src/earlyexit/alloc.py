"""Keep freed memory in the process for the next tensor of the same size (glibc's allocator).

By default glibc serves every allocation above 128 KB (above 32 MB once it adapts) with a fresh ``mmap`` and
returns it to the system when the tensor is freed, so the next tensor of that size faults in every page again
(the kernel zeroes each 4 KB page on first touch). A training step allocates and frees gigabytes of
activations, logits and gradients, so on the reference 2-core machine about half of a LayerSkip step went to
those page faults. Measured there (``benchmarks/bench_train_amp.py``, bf16): 7.0 s a step and 12.7 million
minor faults over three steps with the default, 3.6 s a step and 3.0 million faults over eight steps with
:func:`retain_freed_memory`; the cpu profile's 40-step LayerSkip run took 116 s instead of 254 s, with
bit-identical losses (the allocator moves no arithmetic), and all five of its training runs peaked at 7.2 GB
in one process. Decoding, whose tensors are small, runs at the same speed either way.

:func:`retain_freed_memory` tells glibc (``mallopt``) to serve every allocation from its heap, never to give
the heap's top back, and to grow it 256 MB at a time. A process then keeps its peak memory until it exits,
which a chapter or a training run does. It is called by every chapter's set-up and by the training loop
(so by ``python -m earlyexit train`` too); ``EARLYEXIT_RETAIN_MEMORY=0`` turns it off. On a libc without
``mallopt`` (macOS, musl) it does nothing.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4      # glibc's <malloc.h>
SETTINGS = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1), (M_TOP_PAD, 256 << 20))


@functools.cache
def retain_freed_memory() -> bool:
    """Switch this process's allocator to keeping freed memory (see the module docstring), once; True when
    glibc accepted the settings, False where there is no glibc, or where ``EARLYEXIT_RETAIN_MEMORY=0``."""
    if os.environ.get("EARLYEXIT_RETAIN_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(p, v) == 1 for p, v in SETTINGS)

"""Freed memory is kept for the next tensors (earlyexit.alloc): measured in fresh processes by the page faults
that repeating the same step of large allocations and frees costs (a stand-in for a training step's
activations, logits and gradients)."""
import os
import subprocess
import sys

import pytest

PROBE = """
import resource, sys
import torch
from earlyexit.alloc import retain_freed_memory
on = retain_freed_memory() if sys.argv[1] == "retain" else False
def step():
    a = torch.ones(16 << 20); b = torch.ones(8 << 20); c = torch.ones(50 << 20); d = a + 1; e = c * 2
    del a, b, c, d, e
step()                              # warm: the first touch faults the pages in in either case
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(6):
    step()
print(on, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode, env=None):
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, env=env)
    on, n = out.stdout.split()
    return on == "True", int(n)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator only")
def test_retained_memory_is_reused_without_faulting_its_pages_in_again():
    on, kept = _faults("retain")
    assert on, "glibc refused the allocator settings"
    _, default = _faults("default")
    # by default every one of these tensors (32 to 200 MB) is a fresh mmap: 560 MB of pages faulted in a step
    assert default > 6 * 560 * 256 * 0.9
    assert kept < default / 2


def test_the_switch_can_be_turned_off():
    on, _ = _faults("retain", {**os.environ, "EARLYEXIT_RETAIN_MEMORY": "0"})
    assert not on

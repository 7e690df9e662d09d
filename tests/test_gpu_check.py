"""The GPU check's dry run: the same script on the CPU with a tiny model (one notebook, then the headline
numbers); and its refusal when no GPU is visible."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def test_dry_run_on_the_cpu_prints_the_headline_numbers():
    res = subprocess.run([sys.executable, "scripts/gpu-check", "--device", "cpu", "--tiny", "--tokens", "8",
                          "--only", "01_kv_cache_invariant"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "notebook 01_kv_cache_invariant: ran in" in out
    assert "ratio" in out and "self-speculation" in out and "lossless True" in out and "training step" in out
    shape = [ln for ln in out.splitlines() if ln.startswith("shape SmolLM2-135M (1 layers")]
    assert shape and "layer x1" in shape[0] and "(roofline" in shape[0], out[-2000:]
    spec = [ln for ln in out.splitlines() if ln.startswith("self-speculation SmolLM2-135M (accepting")]
    assert spec and "acceptance 1.00" in spec[0] and "lossless True" in spec[0] and "(roofline)" in spec[0], out[-2000:]
    assert not (ROOT / "book" / "generated" / ".gpu-check").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the refusal cannot be seen here")
def test_no_gpu_is_a_clear_error():
    res = subprocess.run([sys.executable, "scripts/gpu-check"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "no CUDA GPU is visible" in res.stderr and "--device cpu --tiny" in res.stderr

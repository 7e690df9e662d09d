"""Timing on an accelerator waits for its kernels (checked on the CPU with a stand-in for CUDA's synchronize)."""
import torch

from earlyexit import clock


def test_now_waits_for_cuda_kernels_and_not_for_the_cpu(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: waited.append(str(dev)))
    t = clock.now("cuda:0")
    assert waited == ["cuda:0"] and t > 0
    clock.now(torch.device("cpu"))
    clock.now(None)
    assert waited == ["cuda:0"]


def test_the_engine_and_the_trainer_read_the_clock_through_it():
    import inspect

    from earlyexit.experiments import costmodel
    from earlyexit.engine import loop, speculative
    from earlyexit.training import loop as tloop

    for mod in (loop, speculative, tloop, costmodel):
        src = inspect.getsource(mod)
        assert "perf_counter" not in src and ("now(" in src or "clock_now(" in src), mod.__name__

"""Test-session settings.

Torch runs on ONE thread in the tests: the models here are small (hidden size 64 to 576), a second
thread buys little, and on a busy 2-core machine two threads that wait for each other made decoding
10-40x slower (measured). Results do not depend on it: every test compares within one thread count.
"""
import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _within_run_intervals():
    """Each test starts with paired speeds' run-to-run spread at 0 (a bare library call's), whatever a test
    before it set (chapter.setup sets it from a profile for the rest of its process)."""
    from earlyexit.experiments import speeds

    speeds.set_run_sd(0.0)
    yield
    speeds.set_run_sd(0.0)


@pytest.fixture(scope="module")
def counts_dir(tmp_path_factory):
    """One result cache for a test module: what it caches (the shortlist's token counts, about a million
    tokens) is made once per module."""
    from earlyexit import paths

    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paths, "CACHE", root)
        yield root

"""The benchmarks run (on tiny models, minimal sizes): a benchmark that no longer starts is caught here, not
when someone needs its numbers."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    res = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_engine_benchmark_prints_every_path_against_its_ceiling():
    out = run("benchmarks/bench_engine.py", "--model", "tiny-llama", "--prompts", "2", "--tokens", "4", "--reps", "1")
    rows = {ln.split()[0] for ln in out.splitlines() if ln.strip()}
    assert {"fp32", "fp32-modules", "bf16", "int8", "int4", "hf"} <= rows
    assert "engine float32 / HF generate" in out and "vs llama.cpp" in out and "where a token's" in out
    assert "llama-Q4_1: skipped" in out          # llama.cpp runs on the embedded GGUF only


def test_engine_benchmark_times_the_kernels_by_rows():
    out = run("benchmarks/bench_engine.py", "--model", "tiny-llama", "--kernels")
    assert "oneDNN us" in out and "LM head" in out and "W_down" in out
    assert len([ln for ln in out.splitlines() if ln.startswith("W_O ")]) == 6     # rows 1, 2, 3, 4, 8, 16


def test_early_exit_benchmark_prints_ratios_and_the_goal():
    out = run("benchmarks/bench_early_exit.py", "--profile", "smoke", "--prompts", "1", "--tokens", "4", "--reps", "1",
              "--thresholds", "0.5")
    assert "classifier 0.5 / lazy-recompute" in out and "goal:" in out


def test_selfspec_benchmark_prints_ours_the_peer_and_the_goal():
    out = run("benchmarks/bench_selfspec.py", "--profile", "smoke", "--prompts", "1", "--tokens", "6", "--reps", "1",
              "--shortlist", "512", "--exit-layer", "3", "--skip", "2")
    assert "K=512" in out and "HF assistant_early_exit" in out and "goal:" in out
    assert "layer-skip draft (2 of 6 out)" in out and "layer-skip draft (2 of 6 out) d=1 K=512" in out
    assert "economize frspec K=512 layer_skip (2 of 6 out) d=1" in out
    assert "HF generate (full depth)" in out and "economize layer_skip (2 of 6 out)" in out
    assert "economize's fastest lossless technique" in out


def test_threads_benchmark_prints_quiet_and_contended():
    out = run("benchmarks/bench_threads.py", "--profile", "smoke", "--threads", "1", "--tokens", "4", "--steps", "1",
              "--reps", "1")
    assert "quiet" in out and "one busy process" in out and "best under" in out


def test_training_autocast_benchmark_prints_both_step_times_and_the_loss_gap():
    out = run("benchmarks/bench_train_amp.py", "--model", "tiny-llama", "--steps", "2", "--batch", "2", "--seq", "16",
              "--threads", "1")
    assert "float32: median step" in out and "bfloat16 autocast / float32 step time" in out
    assert "largest loss difference" in out


def test_busy_benchmark_runs_a_chapter_cold_quiet_and_contended():
    out = run("benchmarks/bench_busy.py", "--profile", "smoke", "--only", "01_kv_cache_invariant",
              "--set", "threads=auto")
    assert "quiet" in out and "one busy process" in out and "busy / quiet =" in out


def test_timing_benchmark_prints_both_estimators_of_an_aa_ratio():
    out = run("benchmarks/bench_timing.py", "--model", "tiny-llama", "--prompts", "2", "--rounds", "2", "--tokens", "4",
              "--blocks", "1")
    assert "median of rounds %" in out and "step floor %" in out and out.count("\n    0 ") == 1 and "  all " in out

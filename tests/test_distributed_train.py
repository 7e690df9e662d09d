"""Training under torchrun (2 processes, gloo on the CPU) follows the one-process run: the same global batch,
data order and layer-dropout draws, so the loss curve agrees to 1e-4 a step; only rank 0 writes checkpoints,
and a run resumed under torchrun continues the curve."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from earlyexit.training.distributed import World, world
from earlyexit.training.loop import latest_checkpoint, train
from earlyexit.training.recipe import TrainConfig

sys.path.insert(0, str(Path(__file__).parent))
from test_train import blocks_fn, tiny  # noqa: E402

CFG = dict(steps=4, batch_size=4, seq_len=12, lr=2e-3, warmup=1, p_max=0.5, e_scale=0.5, curriculum="rotational",
           curriculum_param=2, weight_decay=0.01, checkpoint_every=2, keep_checkpoints=3, seed=5)

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    sys.path.insert(0, {tests!r})
    from test_train import blocks_fn, tiny
    from earlyexit.training.distributed import world
    from earlyexit.training.loop import train
    from earlyexit.training.recipe import TrainConfig
    torch.set_num_threads(1)
    w = world()
    h = train(tiny(seed=0), blocks_fn(4, 12), TrainConfig(**{cfg!r}), {out!r}, progress=False, parallel={mode!r})
    if w.main:
        json.dump({{"loss": h["loss"], "final_ce": h["final_ce"], "size": w.size}}, open({out!r} + ".json", "w"))
""")


def _torchrun(tmp_path, out, mode="ddp", n=2):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent), cfg=CFG, out=str(out), mode=mode))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
                        "--standalone", str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(Path(str(out) + ".json").read_text())


def test_a_plain_process_is_rank_0_of_1_and_rows_split_evenly():
    assert world() == World()
    assert World(1, 2).rows(4) == (2, 4)
    with pytest.raises(ValueError, match="multiple of 3"):
        World(0, 3).rows(4)
    with pytest.raises(ValueError, match="parallel must be one of ddp, fsdp"):
        train(tiny(seed=0), blocks_fn(4, 12), TrainConfig(**CFG), None, progress=False, parallel="zero3")


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_follow_the_one_process_loss_curve_and_resume(tmp_path, mode):
    torch.set_num_threads(1)
    one = train(tiny(seed=0), blocks_fn(4, 12), TrainConfig(**CFG), tmp_path / "one", progress=False)
    two = _torchrun(tmp_path, tmp_path / "two", mode)
    assert two["size"] == 2
    assert len(two["loss"]) == CFG["steps"]
    assert max(abs(a - b) for a, b in zip(one["loss"], two["loss"])) < 1e-4
    assert max(abs(a - b) for a, b in zip(one["final_ce"], two["final_ce"])) < 1e-4
    # rank 0 wrote the checkpoints, once each
    names = sorted(p.name for p in (tmp_path / "two").iterdir())
    assert names == ["step_00000002", "step_00000004"]
    # resume under torchrun: drop the last checkpoint, run again, the curve continues where it stopped
    import shutil

    shutil.rmtree(tmp_path / "two" / "step_00000004")
    assert latest_checkpoint(tmp_path / "two").name == "step_00000002"
    again = _torchrun(tmp_path, tmp_path / "two", mode)
    assert max(abs(a - b) for a, b in zip(one["loss"], again["loss"])) < 1e-4
    # the checkpoint holds the full weights, whichever way they were spread over the processes
    from safetensors.torch import load_file

    w1 = load_file(str(tmp_path / "one" / "step_00000004" / "model.safetensors"))
    w2 = load_file(str(tmp_path / "two" / "step_00000004" / "model.safetensors"))
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-4

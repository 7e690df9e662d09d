"""The generated box that opens each executed chapter: profile, run time, commit, and the two commands
that rebuild it, which really do pass the parameters the runner passed."""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from earlyexit.book import runner
from test_foundation_runner import book  # noqa: F401  (the throwaway book fixture)


def _injected(path: Path) -> dict:
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", []))
    ns: dict = {}
    exec(cell.source, ns)  # noqa: S102 - papermill's own literal assignments
    return {k: v for k, v in ns.items() if not k.startswith("_")}


def _run_papermill(cmd: str, cwd: Path) -> dict:
    """Run the box's papermill command with --prepare-only (inject, do not execute); return what it injected."""
    argv = shlex.split(cmd.replace("\\\n", " "))  # the shell's line continuation
    assert argv[0] == "papermill"
    exe = Path(sys.executable).parent / "papermill"
    res = subprocess.run([str(exe), *argv[1:], "--prepare-only"], cwd=cwd, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return _injected(cwd / argv[2])


PARAMS = {"model": "tiny-llama", "device": "cpu", "dtype": None, "seed": 3, "profile": "smoke",
          "thresholds": [0.3, 0.9], "rate": 0.25, "flag": True, "label": "1e3", "note": "two words",
          "steps": 4}
DEFAULTS = {"model": "smollm2-135m", "device": "auto", "dtype": None, "seed": 0, "profile": "cpu",
            "thresholds": [0.5], "rate": 0.5, "flag": False, "label": "x", "note": "", "steps": 4}


def test_papermill_command_passes_exactly_the_non_default_values(tmp_path):
    cmd = runner.papermill_command("zz_nb", PARAMS, DEFAULTS)
    assert cmd.startswith("papermill notebooks/zz_nb.ipynb zz_nb.out.ipynb ")
    assert "-p dtype" not in cmd and "-p steps" not in cmd, "defaults are left out"
    assert "-r label 1e3" in cmd, "a string papermill would read as a number goes raw"
    (tmp_path / "notebooks").mkdir()
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in DEFAULTS.items()))
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "notebooks" / "zz_nb.ipynb")
    injected = _run_papermill(cmd, tmp_path)
    assert {**DEFAULTS, **injected} == PARAMS
    for k, v in injected.items():
        assert type(v) is type(PARAMS[k]), (k, v)


def test_a_long_command_is_wrapped_with_continuations_and_still_runs(tmp_path):
    cmd = runner.papermill_command("zz_nb", PARAMS, DEFAULTS, width=60)
    lines = cmd.split("\n")
    assert len(lines) > 2 and all(ln.endswith(" \\") for ln in lines[:-1])
    assert all(len(ln) <= 60 + 40 for ln in lines)
    assert shlex.split(cmd.replace("\\\n", " ")) == shlex.split(runner.papermill_command("zz_nb", PARAMS, DEFAULTS))


def test_each_executed_chapter_opens_with_its_claim_then_the_generated_box(book):  # noqa: F811
    assert runner.main(["--profile", "t", "--only", "zz_ok", "--no-build"]) == 0
    out = book / "book" / "generated" / "zz_ok.ipynb"
    nb = nbformat.read(out, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# A test chapter")
    box = nb.cells[1]
    assert box.cell_type == "markdown" and runner.RERUN_TAG in box.metadata["tags"]
    meta = nb.metadata["earlyexit"]
    src = box.source
    assert src.startswith(":::{admonition} Built with profile `t` in ")
    assert f":class: dropdown note {runner.RERUN_TAG}" in src
    assert "python -m earlyexit book --profile t --only zz_ok --rerun" in src
    assert f"Commit: `{meta['git_commit']}`" in src
    assert f"at commit `{meta['git_commit'][:12]}`" in src
    pm = src[src.index("papermill notebooks/"):].split("\n```")[0]
    assert pm == "papermill notebooks/zz_ok.ipynb zz_ok.out.ipynb -p model tiny-llama -p profile t -p x 5"
    # the command really injects what the runner injected
    injected = _run_papermill(pm, book)
    assert injected == {k: meta["parameters"][k] for k in injected}
    assert {"model": "tiny-llama", "x": 5, "profile": "t"}.items() <= injected.items()
    # a rerun replaces the box, it does not add a second one
    assert runner.main(["--profile", "t", "--only", "zz_ok", "--no-build", "--rerun"]) == 0
    nb = nbformat.read(out, as_version=4)
    assert sum(runner.RERUN_TAG in c.metadata.get("tags", []) for c in nb.cells) == 1
    nbformat.validate(nb)


@pytest.mark.parametrize("seconds, text", [(4.2, "4 s"), (75, "1 min 15 s"), (3725, "1 h 02 min")])
def test_run_time_reads_as_a_person_would_say_it(seconds, text):
    src = runner.rerun_box("zz", {"profile": "cpu", "duration_s": seconds, "git_commit": "b" * 40,
                                  "git_dirty": True, "parameters": {}})
    assert f"in {text}, at commit `{'b' * 12}` (with uncommitted changes)" in src.splitlines()[0]


def test_a_notebook_without_markdown_gets_the_box_first():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]
    nb.metadata["earlyexit"] = {"profile": "smoke", "duration_s": 1, "git_commit": "c" * 40, "parameters": {}}
    runner.add_rerun_box(nb, "zz")
    assert nb.cells[0].cell_type == "markdown" and nb.cells[1].cell_type == "code"

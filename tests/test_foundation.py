"""Foundation: notebooks, profiles, parameters, environment pins, figures, provenance, CLI errors."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import nbformat
import pytest
import yaml

from earlyexit import paths
from earlyexit.book import figures, params, provenance, runner
from earlyexit.book.params import Param

ROOT = paths.REPO_ROOT
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


# ------------------------------------------------------------------------------------ notebooks

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_sources_are_stripped(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i} has outputs: strip them before committing"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution_count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_parameters_match_schema(path):
    """First code cell tagged 'parameters'; the next one is the chapter's whole set-up, a few lines that
    call chapter.setup (which checks the parameters), folded in the book; defaults agree with the schema."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", []), f"{path.name}: first code cell must be tagged"
    assert f'chapter.setup("{path.stem}", globals()' in code[1].source, \
        f"{path.name}: the cell after the parameters must call chapter.setup({path.stem!r}, globals())"
    lines = [ln for ln in code[1].source.splitlines() if ln.strip()]
    assert len(lines) <= 8, f"{path.name}: the set-up cell has {len(lines)} lines; keep it to a few"
    assert nb.cells.index(code[1]) == nb.cells.index(code[0]) + 1, f"{path.name}: set-up follows the parameters"
    assert {"hide-cell", "remove-cell"} & set(code[1].metadata.get("tags", [])), f"{path.name}: fold the set-up"
    ns: dict = {}
    exec(code[0].source, ns)  # noqa: S102 - our own notebook's literal assignments
    values = {k: v for k, v in ns.items() if not k.startswith("_")}
    schema = params.get(path.stem)
    assert set(values) == set(schema.params), "parameters cell and schema name different parameters"
    assert params.validate(schema, values) == schema.defaults(), "notebook defaults differ from the schema's"


def test_toc_lists_existing_notebooks_with_schemas():
    names = runner.toc_notebooks()
    assert names, "_toc.yml lists no executed notebook"
    for n in names:
        assert (ROOT / "notebooks" / f"{n}.ipynb").exists()
        assert n in params.SCHEMAS
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    assert toc["format"] == "jb-book"


def test_config_does_not_execute_during_build():
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert cfg["execute"]["execute_notebooks"] == "off"
    assert "book/references.bib" in cfg["bibtex_bibfiles"]
    assert {"dollarmath", "amsmath", "colon_fence"} <= set(cfg["parse"]["myst_enable_extensions"])


def test_generated_dir_is_git_ignored():
    out = subprocess.run(["git", "check-ignore", "-q", "book/generated/x.ipynb"], cwd=ROOT)
    if out.returncode == 128:
        pytest.skip("not a git checkout")
    assert out.returncode == 0


# ------------------------------------------------------------------------------------- profiles

@pytest.mark.parametrize("name", ["smoke", "cpu", "gpu"])
def test_shipped_profiles_are_valid(name):
    prof = runner.load_profile(name, notebooks=runner.toc_notebooks())
    for nb in runner.toc_notebooks():
        p = prof.parameters(nb)
        assert p["profile"] == name


def test_smoke_profile_uses_a_tiny_model():
    assert runner.load_profile("smoke").common["model"].startswith("tiny-")


def _write_profile(tmp_path, text):
    (tmp_path / "bad.yml").write_text(text)
    return tmp_path


@pytest.mark.parametrize("text, expected", [
    ("comon: {}\n", "unknown key 'comon' (did you mean 'common'?)"),
    ("notebooks:\n  01_kv_cache_invariants: {}\n", "did you mean '01_kv_cache_invariant'?"),
    ("notebooks:\n  01_kv_cache_invariant: {batch: 'two'}\n", "batch: expected int, got str"),
    ("notebooks:\n  01_kv_cache_invariant: {max_new_token: 3}\n", "did you mean 'max_new_tokens'?"),
    ("common: {max_new_tokens: 3}\n", "is not a common parameter"),
    ("common: {device: gpu}\n", "'gpu' is not one of"),
    ("timeout_s: -1\n", "timeout_s must be a positive integer"),
    ("- a list\n", "must be a mapping"),
])
def test_profile_validation_errors(tmp_path, text, expected):
    with pytest.raises(runner.UsageError) as e:
        runner.load_profile("bad", profiles_dir=_write_profile(tmp_path, text),
                            notebooks=["01_kv_cache_invariant"])
    assert expected in str(e.value)


def test_profile_lists_every_problem_at_once(tmp_path):
    text = "notebooks:\n  01_kv_cache_invariant: {batch: 0, seed: -1, bogus: 1}\n"
    with pytest.raises(runner.UsageError) as e:
        runner.load_profile("bad", profiles_dir=_write_profile(tmp_path, text),
                            notebooks=["01_kv_cache_invariant"])
    msg = str(e.value)
    assert "batch: 0 is out of range" in msg and "seed: -1 is out of range" in msg and "'bogus'" in msg


# ------------------------------------------------------------------------------------ parameters

SCHEMA = params.Schema({
    "n": Param(int, 3, "count", range=(1, 10)),
    "rate": Param(float, 0.5, "a rate", range=(0.0, 1.0)),
    "flag": Param(bool, False, "a switch"),
    "rule": Param(str, "margin", "exit rule", choices=("margin", "softmax", "oracle")),
    "layers": Param(list, [1, 2], "layers", item=int, range=(0, 29)),
    "maybe": Param((str, type(None)), None, "optional"),
}, name="test_nb")


def test_validate_fills_defaults_and_widens_ints_to_float():
    p = params.validate(SCHEMA, {"rate": 1, "n": 4})
    assert p == {"n": 4, "rate": 1.0, "flag": False, "rule": "margin", "layers": [1, 2], "maybe": None}
    assert isinstance(p["rate"], float) and p.n == 4 and p.notebook == "test_nb"


@pytest.mark.parametrize("values, expected", [
    ({"n": True}, "n: expected int, got bool True"),
    ({"flag": 1}, "flag: expected bool, got int 1"),
    ({"n": 2.0}, "n: expected int, got float"),
    ({"n": 11}, "n: 11 is out of range [1, 10]"),
    ({"rate": float("nan")}, "NaN is not allowed"),
    ({"rule": "margn"}, "'margn' is not one of ['margin', 'softmax', 'oracle'] (did you mean 'margin'?)"),
    ({"layers": [1, "2"]}, "layers[1]: expected int, got str"),
    ({"layers": [1, 30]}, "layers item 30: 30 is out of range"),
    ({"rat": 0.1}, "unknown parameter 'rat' (did you mean 'rate'?)"),
    ({"maybe": 3}, "maybe: expected str or None, got int"),
])
def test_validate_errors(values, expected):
    with pytest.raises(ValueError) as e:
        params.validate(SCHEMA, values)
    assert expected in str(e.value)


def test_validate_reports_all_problems_and_lists_valid_names():
    with pytest.raises(ValueError) as e:
        params.validate(SCHEMA, {"n": 0, "flag": "yes", "colour": 1})
    msg = str(e.value)
    assert msg.count("\n  - ") == 3
    assert "valid parameters:" in msg and "rule" in msg


def test_check_catches_a_misspelt_injected_parameter():
    import numpy as np

    ns = {"model": "tiny-llama", "max_new_token": 5, "np": np, "__name__": "__main__", "In": [],
          "_": None, "check_me": lambda: 0}
    with pytest.raises(ValueError, match="unknown parameter 'max_new_token' .did you mean 'max_new_tokens'"):
        params.check("01_kv_cache_invariant", ns)
    ok = params.check("01_kv_cache_invariant", {"model": "tiny-llama", "np": np})
    assert ok.model == "tiny-llama" and ok.notebook == "01_kv_cache_invariant"


def test_register_rejects_redeclared_common_and_get_suggests():
    with pytest.raises(ValueError, match="COMMON"):
        params.register("zz_bad", seed=Param(int, 1))
    with pytest.raises(ValueError, match="did you mean '01_kv_cache_invariant'"):
        params.get("01_kv_cache_invariants")


# ---------------------------------------------------------------------------------- environment

def _pins(lines):
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def test_environment_yml_and_lock_name_the_same_versions():
    lock = _pins((ROOT / "requirements.lock").read_text().splitlines())
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    env_pins = _pins(pip_section)
    assert {"torch", "transformers", "jupyter-book", "papermill", "myst-nb", "gguf"} <= set(env_pins)
    mismatched = {k: (v, lock.get(k)) for k, v in env_pins.items() if lock.get(k) != v}
    assert not mismatched, f"environment.yml vs requirements.lock: {mismatched}"
    assert "python=3.11" in env["dependencies"]


def test_lock_pins_exactly_and_leaves_out_local_builds_and_the_package():
    text = (ROOT / "requirements.lock").read_text()
    reqs = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert all("==" in ln for ln in reqs), [ln for ln in reqs if "==" not in ln]
    assert "torch==2.13.0" in reqs
    assert not any("+" in ln for ln in reqs), "local version tags (e.g. +cpu) do not belong in the lock"
    assert not any(ln.lower().startswith(("earlyexit", "-e ")) for ln in reqs)


def test_pyproject_ranges_admit_the_gpu_machine_and_the_lock():
    import tomllib

    from packaging.requirements import Requirement

    deps = {Requirement(d).name: Requirement(d).specifier
            for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    lock = _pins((ROOT / "requirements.lock").read_text().splitlines())
    assert deps["torch"].contains("2.11.0") and deps["torch"].contains(lock["torch"])
    assert deps["transformers"].contains("5.17.0") and deps["transformers"].contains(lock["transformers"])
    for name, spec in deps.items():
        key = name.lower().replace("_", "-")
        assert key in lock and spec.contains(lock[key]), f"lock's {name}=={lock.get(key)} is outside {spec}"


# -------------------------------------------------------------------------- figures, provenance

def test_save_figure_writes_three_formats_and_a_sidecar(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    fig, ax = figures.subplots()
    ax.plot([1, 10, 100], [1, 2, 3], label="a line")
    ax.set(xlabel="tokens", ylabel="bytes")
    ax.legend()
    prov = provenance.collect({"profile": "smoke", "seed": 0}, notebook="01_kv_cache_invariant")
    out = figures.save_figure(fig, "test_fig", prov, directory=tmp_path)
    assert set(out) == {"png", "pdf", "svg", "json"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test_fig.json", "test_fig.pdf", "test_fig.png",
                                                          "test_fig.svg"]
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"FontFile2" in out["pdf"].read_bytes(), "PDF fonts must be embedded as TrueType (fonttype 42)"
    assert "<text" in out["svg"].read_text(), "SVG text must stay text (svg.fonttype none)"
    side = json.loads(out["json"].read_text())
    assert side["rerun"] == "python -m earlyexit book --profile smoke --only 01_kv_cache_invariant --rerun"
    assert side["provenance"]["git_commit"] and side["provenance"]["software"]["torch"]
    first = {k: p.read_bytes() for k, p in out.items() if k != "json"}
    figures.save_figure(fig, "test_fig", prov, directory=tmp_path)
    assert first == {k: p.read_bytes() for k, p in out.items() if k != "json"}, "figure bytes not reproducible"
    assert not list(tmp_path.glob(".*")), "temporary files left behind"
    with pytest.raises(ValueError):
        figures.save_figure(fig, "../escape", prov, directory=tmp_path)


def test_provenance_record_has_what_a_reader_needs():
    class FakeModel:
        device = "cpu"

        def provenance(self):
            return {"model_spec": "tiny-llama", "weights_sha256": "ab" * 32}

    rec = provenance.collect(params.get("01_kv_cache_invariant").defaults(), model=FakeModel())
    for key in ("git_commit", "git_dirty", "code_version", "parameters", "profile", "seed", "software",
                "device", "date_utc", "notebook"):
        assert key in rec, key
    assert rec["model"]["weights_sha256"] == "ab" * 32
    assert rec["notebook"] == "01_kv_cache_invariant"
    assert rec["software"]["python"].startswith("3.")
    json.dumps(rec)


# ------------------------------------------------------------------------------------------ CLI

def test_unknown_profile_exits_2_listing_valid_ones(capsys):
    assert runner.main(["--profile", "cpuu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "unknown profile 'cpuu'" in err and "valid: cpu, gpu, llama1b, smoke" in err


def test_unknown_notebook_exits_2_listing_valid_ones(capsys):
    assert runner.main(["--profile", "smoke", "--only", "01_kv_cache"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "unknown notebook '01_kv_cache'" in err and "01_kv_cache_invariant" in err


def test_cli_entry_point_exit_code():
    res = subprocess.run([sys.executable, "-m", "earlyexit", "book", "--profile", "nope"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2
    assert res.stderr.startswith("error: unknown profile 'nope'")
    res = subprocess.run([sys.executable, "-m", "earlyexit", "bok"], capture_output=True, text=True)
    assert res.returncode == 2 and "valid: book" in res.stderr


@pytest.mark.parametrize("cmd", ["book", "fetch-model", "train", "sweep", "params", "provenance", "figures-bundle"])
def test_every_command_answers_help_without_doing_anything(cmd, tmp_path):
    """``--help`` prints a usage and exits 0, before any work: no model fetched, no file written, not even torch
    imported (a fetch that starts on --help, or a --help that fails, is what a new user meets first)."""
    probe = ("import sys, io, contextlib\n"
             "from earlyexit.__main__ import main, COMMANDS\n"
             "out = io.StringIO()\n"
             "with contextlib.redirect_stdout(out):\n"
             f"    rc = main([{cmd!r}, '--help'])\n"
             "print(rc, 'torch' in sys.modules, repr(out.getvalue()))\n")
    before = sorted((ROOT / "data").rglob("*"))
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    rc, torch_loaded, text = res.stdout.split(" ", 2)
    assert (rc, torch_loaded) == ("0", "False"), res.stdout + res.stderr
    assert f"usage: python -m earlyexit {cmd}" in text
    assert sorted((ROOT / "data").rglob("*")) == before
    from earlyexit.__main__ import COMMANDS

    assert set(COMMANDS) == {"book", "fetch-model", "train", "sweep", "params", "provenance", "figures-bundle"}


def test_readme_quick_start_is_the_two_make_targets():
    """README's quick start holds exactly two commands, `make book` and `make test`, and make knows both (a dry
    run lists their recipes without running them)."""
    import re

    text = (ROOT / "README.md").read_text()
    block = text[text.index("## Quick start"):]
    block = block[block.index("```bash") + 7:]
    commands = [ln.split("#")[0].strip() for ln in block[:block.index("```")].splitlines() if ln.split("#")[0].strip()]
    assert commands == ["make book", "make test"], commands
    for target in ("book", "test"):
        dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0 and re.search(r"earlyexit book --profile (cpu|smoke)", dry.stdout), dry.stderr


def test_ci_script_runs_make_test(tmp_path):
    """.ci/run, run as CI runs it (bash, no standard input), ends in `make test`: here `make` is a stand-in on the
    PATH that records its arguments, and the browser install is skipped."""
    import os

    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "make").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\n")
    (stub / "make").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "EARLYEXIT_NO_BROWSER": "1", "CI": "true"}
    res = subprocess.run(["bash", str(ROOT / ".ci" / "run")], env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "calls").read_text().split("\n")[-2] == "test"

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_reads_every_declared_parameter(path):
    """`papermill --help-notebook` (and -p) sees each parameter of the schema: a line it cannot parse (an '='
    in the comment, say) would be passed as unknown and listed nowhere."""
    import papermill

    from earlyexit.book import params

    seen = set(papermill.inspect_notebook(str(path)))
    assert seen == set(params.get(path.stem).params), sorted(seen ^ set(params.get(path.stem).params))

"""The runner on a throwaway book: parameters injected, up-to-date copies skipped, failures kept apart."""
from __future__ import annotations

import json

import nbformat
import pytest

from earlyexit import paths
from earlyexit.book import jobs, params, runner
from earlyexit.book.params import Param


def _notebook(path, *sources):
    nb = nbformat.v4.new_notebook()
    cells = [nbformat.v4.new_code_cell(sources[0])]
    cells[0].metadata["tags"] = ["parameters"]
    cells += [nbformat.v4.new_code_cell(s) for s in sources[1:]]
    nb.cells = [nbformat.v4.new_markdown_cell("# A test chapter")] + cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@pytest.fixture
def book(tmp_path, monkeypatch):
    for sub in ("notebooks", "profiles", "book/generated"):
        (tmp_path / sub).mkdir(parents=True)
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(paths, "NOTEBOOKS", tmp_path / "notebooks")
    monkeypatch.setattr(paths, "GENERATED", tmp_path / "book" / "generated")
    monkeypatch.setattr(paths, "PROFILES", tmp_path / "profiles")
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: intro\nchapters:\n"
        "  - file: book/generated/zz_fail\n  - file: book/generated/zz_ok\n")
    (tmp_path / "profiles" / "t.yml").write_text(
        "description: test\ncommon: {model: tiny-llama}\nnotebooks:\n  zz_ok: {x: 5}\n")
    _notebook(tmp_path / "notebooks" / "zz_ok.ipynb",
              "x = 1  # a number\nmodel = 'smollm2-135m'",
              # the kernel is another process: it declares the test schema itself
              "from earlyexit.book import params\n"
              "params.register('zz_ok', x=params.Param(int, 1, 'a number', range=(0, 9)))\n"
              "P = params.check('zz_ok', globals())",
              "print('x is', P.x, 'model', P.model)")
    _notebook(tmp_path / "notebooks" / "zz_fail.ipynb",
              "x = 1", "y = 2", "raise ValueError('boom at ' + str(x))", "print('never')")
    params.register("zz_ok", x=Param(int, 1, "a number", range=(0, 9)))
    params.register("zz_fail", x=Param(int, 1, "a number"))
    yield tmp_path
    params.SCHEMAS.pop("zz_ok", None)
    params.SCHEMAS.pop("zz_fail", None)


def _outputs(nb):
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_executes_with_profile_parameters_then_skips_until_rerun(book, capsys):
    assert runner.main(["--profile", "t", "--only", "zz_ok", "--no-build"]) == 0
    out_path = book / "book" / "generated" / "zz_ok.ipynb"
    nb = nbformat.read(out_path, as_version=4)
    assert "x is 5 model tiny-llama" in _outputs(nb)
    meta = nb.metadata["earlyexit"]
    assert meta["profile"] == "t" and meta["parameters"]["x"] == 5 and len(meta["run_hash"]) == 64
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "hide-cell" in injected[0].metadata["tags"]
    # both parameter cells are folded behind a one-line summary, so the page opens with its claim
    assert injected[0].metadata["mystnb"]["code_prompt_show"].startswith("Parameters of this build: profile t, model tiny-llama")
    defaults = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert "hide-cell" in defaults[0].metadata["tags"] and "{" not in defaults[0].metadata["mystnb"]["code_prompt_show"]

    capsys.readouterr()
    mtime = out_path.stat().st_mtime_ns
    assert runner.main(["--profile", "t", "--only", "zz_ok", "--no-build"]) == 0
    assert "up to date" in capsys.readouterr().out
    assert out_path.stat().st_mtime_ns == mtime

    assert runner.main(["--profile", "t", "--only", "zz_ok", "--no-build", "--rerun"]) == 0
    assert out_path.stat().st_mtime_ns != mtime


def test_retime_clears_the_timings_and_nothing_else_then_executes_again(book, capsys, monkeypatch):
    from earlyexit import store
    from earlyexit.book.agreement import TIMED

    monkeypatch.setattr(paths, "CACHE", book / "cache")
    for name in ("paired_timing", "shape_units", "point", "drift"):
        store.cached(name, {"k": 1}, lambda: {"v": 1.0}, model="m")
    files = sum(1 for n in ("paired_timing", "shape_units") for p in (book / "cache" / n).glob("*") if p.is_file())
    assert runner.main(["--profile", "t", "--only", "zz_ok", "--no-build"]) == 0
    out_path = book / "book" / "generated" / "zz_ok.ipynb"
    mtime = out_path.stat().st_mtime_ns
    capsys.readouterr()
    assert runner.main(["--profile", "t", "--only", "zz_ok", "--no-build", "--retime"]) == 0
    out = capsys.readouterr().out
    assert files >= 2 and f"moved {files} timed result files to cleared-timings/" in out and "up to date" not in out
    assert len(list((book / "cleared-timings").glob("*/*/*"))) == files, "the first run's timings are kept aside"
    assert out_path.stat().st_mtime_ns != mtime, "--retime executes again, as --rerun does"
    assert not store.has("paired_timing", {"k": 1}, model="m") and not store.has("shape_units", {"k": 1}, model="m")
    assert store.has("point", {"k": 1}, model="m") and store.has("drift", {"k": 1}, model="m"), "the rest is kept"
    assert {"paired_timing", "shape_units"} <= set(TIMED)


def test_failed_notebook_stops_names_the_error_and_keeps_partial_output_apart(book, capsys):
    rc = runner.main(["--profile", "t", "--only", "zz_fail", "zz_ok", "--no-build"])
    assert rc == 1
    captured = capsys.readouterr()
    err = "\n".join(ln for ln in captured.err.splitlines() if not ln.startswith("Executing"))
    assert "error: notebook zz_fail failed in cell [4] line 1 `raise ValueError('boom at ' + str(x))`: " \
           "ValueError: boom at 1" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
    gen = book / "book" / "generated"
    assert not (gen / "zz_fail.ipynb").exists(), "a failed run must not leave a file at the final path"
    assert not list(gen.glob(".*running*")), "temporary output left behind"
    partial = nbformat.read(gen / "zz_fail.failed.ipynb", as_version=4)
    assert any(o.get("ename") == "ValueError" for c in partial.cells if c.cell_type == "code"
               for o in c.outputs)
    assert "zz_ok" in runner.toc_notebooks()
    assert not (gen / "zz_ok.ipynb").exists(), "the run must stop at the first failure"


def test_profile_parameter_error_stops_before_any_work(book, capsys):
    (book / "profiles" / "t.yml").write_text("notebooks:\n  zz_ok: {x: 12}\n")
    assert runner.main(["--profile", "t", "--no-build"]) == 2
    err = capsys.readouterr().err
    assert "zz_ok: x: 12 is out of range [0, 9]" in err
    assert not list((book / "book" / "generated").iterdir())


def test_a_misspelt_papermill_parameter_fails_in_the_first_cell(book, capsys):
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    with pytest.raises(PapermillExecutionError) as e:
        pm.execute_notebook(str(book / "notebooks" / "zz_ok.ipynb"), str(book / "out.ipynb"),
                            parameters={"xx": 3}, kernel_name="python3", progress_bar=False)
    assert e.value.ename == "ValueError"
    assert "unknown parameter 'xx' (did you mean 'x'?)" in e.value.evalue
    json.loads((book / "out.ipynb").read_text())


# ------------------------------------------------------------------------------ several notebooks at once

def test_job_order_and_who_may_start():
    names = ["01", "02", "06", "07", "root"]
    alone = {"06", "root"}
    assert jobs.job_order(names, alone, "root") == ["06", "01", "02", "07", "root"]
    # the profile's longest first (after those that run alone); one that runs alone or is not selected is ignored
    assert jobs.job_order(names, alone, "root", ("07", "06", "99")) == ["06", "07", "01", "02", "root"]
    assert jobs.runs_alone("06", {"threads": "auto"}, "root") and jobs.runs_alone("x", {"threads": 2}, "root")
    assert jobs.runs_alone("root", {"threads": 1}, "root") and not jobs.runs_alone("02", {"threads": 1}, "root")
    assert jobs.may_start("06", {}, 2, alone)                       # alone, when nothing runs
    assert not jobs.may_start("06", {"01": 0}, 2, alone)            # ... and only then
    assert not jobs.may_start("01", {"06": 0}, 2, alone)            # nothing beside one that runs alone
    assert jobs.may_start("02", {"01": 0}, 2, alone) and not jobs.may_start("07", {"01": 0, "02": 0}, 2, alone)
    assert not jobs.may_start("02", {"01": 0}, 1, alone)


JOB = ("import json, sys, time; t0 = time.time(); time.sleep(float(sys.argv[2])); "
       "open(sys.argv[3], 'a').write(json.dumps([sys.argv[1], t0, time.time()]) + '\\n'); "
       "sys.exit(1 if sys.argv[1] == 'bad' else 0)")


def _spans(path):
    return {n: (a, b) for n, a, b in (json.loads(ln) for ln in path.read_text().splitlines())}


def test_jobs_run_two_at_a_time_and_the_alone_ones_by_themselves(book, capsys):
    import sys

    log = book / "spans.jsonl"
    order = ["06", "01", "02", "03", "root"]
    rc = jobs.run_jobs(order, {"06", "root"}, 2, lambda n: [sys.executable, "-c", JOB, n, "0.6", str(log)])
    assert rc == 0
    s = _spans(log)
    overlap = lambda a, b: s[a][0] < s[b][1] and s[b][0] < s[a][1]  # noqa: E731
    assert overlap("01", "02"), "two 1-thread notebooks run side by side"
    assert not any(overlap("06", n) or overlap("root", n) for n in ("01", "02", "03"))
    assert s["root"][0] >= max(b for _, b in s.values() if b != s["root"][1]) - 0.01
    assert "[5/5]" in capsys.readouterr().out
    assert (book / "book" / "generated" / ".logs" / "01.log").exists()


def test_a_failed_job_lets_the_running_one_finish_and_starts_no_other(book, capsys):
    import sys

    log = book / "spans.jsonl"
    times = {"bad": "0.1", "slow": "1.0", "later": "0.1"}
    rc = jobs.run_jobs(["bad", "slow", "later"], set(), 2,
                         lambda n: [sys.executable, "-c", JOB, n, times[n], str(log)])
    assert rc == 1
    assert set(_spans(log)) == {"bad", "slow"}, "the running one finishes; the next is not started"
    err = capsys.readouterr().err
    assert "error: bad failed (exit code 1)" in err and "not started after the failure: later" in err


def test_first_must_name_notebooks_of_the_book(book, capsys):
    (book / "profiles" / "t.yml").write_text("jobs: 2\nfirst: [zz_okk]\nnotebooks:\n  zz_ok: {x: 5}\n")
    assert runner.main(["--profile", "t", "--no-build"]) == 2
    err = capsys.readouterr().err
    assert "first: unknown notebook 'zz_okk' (did you mean 'zz_ok'?)" in err
    (book / "profiles" / "t.yml").write_text("jobs: 2\nfirst: zz_ok\nnotebooks:\n  zz_ok: {x: 5}\n")
    assert runner.main(["--profile", "t", "--no-build"]) == 2
    assert "first must be a list of notebook names" in capsys.readouterr().err


def test_jobs_must_be_a_positive_count(book, capsys):
    (book / "profiles" / "t.yml").write_text("jobs: 0\nnotebooks:\n  zz_ok: {x: 5}\n")
    assert runner.main(["--profile", "t", "--no-build"]) == 2
    assert "jobs must be a positive integer" in capsys.readouterr().err
    (book / "profiles" / "t.yml").write_text("notebooks:\n  zz_ok: {x: 5}\n")
    assert runner.main(["--profile", "t", "--no-build", "--jobs", "0"]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err


@pytest.mark.skipif(__import__("os").name == "nt", reason="Unix sockets only")
def test_each_kernel_talks_over_sockets_in_a_directory_of_its_own(book):
    """Two chapters started at once once drew the same TCP port and one kernel died ("Address already in
    use"): each execution's kernel uses Unix sockets in a fresh directory, removed when it ends."""
    from pathlib import Path

    _notebook(book / "notebooks" / "zz_sock.ipynb", "x = 1",
              "from ipykernel import get_connection_info\nc = get_connection_info(unpack=True)\n"
              "print(c['transport'], c['ip'])")
    seen = []
    for _ in range(2):
        out = runner.execute("zz_sock", {"x": 1}, progress=False)
        transport, ip = _outputs(nbformat.read(out, as_version=4)).split()
        seen.append(Path(ip))
        assert transport == "ipc" and Path(ip).parent.name.startswith("earlyexit-kernel-")
        assert not Path(ip).parent.exists(), "the socket directory is removed after the run"
    assert seen[0].parent != seen[1].parent


def test_time_left_shares_the_last_build_times_over_the_jobs():
    left = jobs.time_left(["a", "b", "new"], {"c": 30.0, "d": 5.0}, {"a": 100, "b": 60, "c": 20, "d": 50}, 2)
    assert left == ((100 + 60 + 0 + 45) / 2, 1)          # c has overrun its last time; new was never built
    assert jobs.time_left([], {}, {}, 1) == (0.0, 0)


@pytest.mark.parametrize("left, n_done, want", [
    (None, 1, "[1/3] a: done in 12 s; 40 s so far"),
    ((200.0, 0), 1, "[1/3] a: done in 12 s; 40 s so far, about 200 s left by the last build's times"),
    ((200.0, 1), 1, "[1/3] a: done in 12 s; 40 s so far, about 200 s left by the last build's times "
                    "(and 1 notebook never built before)"),
    ((200.0, 2), 1, "[1/3] a: done in 12 s; 40 s so far, about 200 s left by the last build's times "
                    "(and 2 notebooks never built before)"),
    ((0.0, 2), 1, "[1/3] a: done in 12 s; 40 s so far; no estimate (2 notebooks never built before)"),
    ((0.0, 0), 3, "[3/3] a: done in 12 s; 40 s so far")])
def test_progress_line_every_branch(left, n_done, want):
    assert jobs.progress_line(n_done, 3, "a", 12.4, 40.2, left) == want


def test_jobs_print_the_estimate_from_the_last_build(book, capsys):
    import sys

    log = book / "spans.jsonl"
    rc = jobs.run_jobs(["01", "02", "03"], set(), 1, lambda n: [sys.executable, "-c", JOB, n, "0.1", str(log)],
                       last={"01": 1.0, "02": 50.0, "03": 70.0})
    assert rc == 0
    out = capsys.readouterr().out
    assert "[1/3] 01: done in" in out and "about 120 s left by the last build's times" in out
    assert "about 70 s left" in out and "[3/3] 03: done in" in out

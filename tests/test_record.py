"""A kept build: executed pages stripped to their glue outputs and records, read by agreement as the pages were."""
import json

import pytest

from earlyexit.book import agreement, record
from earlyexit.book.consistency import glued, page_record

PREFIX = "application/papermill.record/"


def _page(path, values: dict, commit="abc1234", profile="cpu", run_sd=0.012, figure=False):
    outs = [{"output_type": "display_data", "metadata": {"scrapbook": {"name": k, "mime_prefix": PREFIX}},
             "data": {PREFIX + "text/plain": repr(v) if isinstance(v, str) else str(v)}} for k, v in values.items()]
    if figure:
        outs.append({"output_type": "display_data", "metadata": {"scrapbook": {"name": "fig", "mime_prefix": PREFIX}},
                     "data": {PREFIX + "image/png": "iVBORw0KGgo" * 1000, PREFIX + "text/plain": "<Figure>"}})
    cells = [{"cell_type": "markdown", "source": "# A chapter", "metadata": {}},
             {"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": [
                 {"output_type": "stream", "name": "stdout", "text": "not glued\n"}] + outs}]
    meta = {"earlyexit": {"git_commit": commit, "profile": profile, "git_dirty": False, "duration_s": 12.5,
                          "executed_utc": "2026-12-08T01:00:00+00:00", "jobs": 2,
                          "parameters": {"timing_run_sd": run_sd}}}
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": meta, "cells": cells}))


def test_a_kept_build_reads_as_the_build(tmp_path):
    built, kept = tmp_path / "generated", tmp_path / "kept"
    built.mkdir()
    _page(built / "04_x.ipynb", {"speed_lazy": "0.93× [0.88, 0.98]", "claim": "Lazy recompute is slower.", "n": 3},
          figure=True)
    _page(built / "07_y.ipynb", {"best_speedup": 1.02, "best_speedup_lo": 0.95, "best_speedup_hi": 1.1})
    _page(built / ".08_z.running.ipynb", {"speed": "1.0× [0.9, 1.1]"})          # still executing: not a page
    m = record.keep(built, kept)
    assert sorted(p.name for p in kept.iterdir()) == ["04_x.ipynb", "07_y.ipynb", "build.json"]
    assert m["commit"] == "abc1234" and m["profile"] == "cpu" and not m["dirty"]
    assert set(m["pages"]) == {"04_x", "07_y"} and m["pages"]["04_x"]["duration_s"] == 12.5
    assert json.loads((kept / "build.json").read_text()) == m
    for name in ("04_x.ipynb", "07_y.ipynb"):
        assert glued(kept / name) == glued(built / name)                       # every glue value, figures' text too
        assert page_record(kept / name) == page_record(built / name)
    assert "image/png" not in (kept / "04_x.ipynb").read_text()                # no image data kept
    assert (kept / "04_x.ipynb").stat().st_size < (built / "04_x.ipynb").stat().st_size / 5
    t = agreement.compare(kept, built)
    assert len(t) == 2 and t["agree"].all() and t["same_verdict"].all()
    assert agreement.wording(kept, built).empty
    assert agreement.recorded_run_sd(kept, built) == 0.012
    assert agreement.main([str(kept), str(built)]) == 0


def test_what_is_not_one_build_is_refused_before_writing(tmp_path):
    empty, mixed, out = tmp_path / "empty", tmp_path / "mixed", tmp_path / "out"
    empty.mkdir(), mixed.mkdir()
    with pytest.raises(ValueError, match="no executed pages"):
        record.keep(empty, out)
    _page(mixed / "04_x.ipynb", {"n": 1}, commit="abc1234")
    _page(mixed / "07_y.ipynb", {"n": 1}, commit="def5678")
    with pytest.raises(ValueError, match="not one build.*abc1234.*def5678"):
        record.keep(mixed, out)
    _page(mixed / "07_y.ipynb", {"n": 1}, profile="smoke")
    with pytest.raises(ValueError, match="profiles.*cpu.*smoke"):
        record.keep(mixed, out)
    assert not out.exists()
    _page(mixed / "07_y.ipynb", {"n": 1})
    record.keep(mixed, out)
    with pytest.raises(ValueError, match="already holds pages"):
        record.keep(mixed, out)
    assert record.main([str(mixed), str(out)]) == 1 and record.main([]) == 2


def test_machines_are_told_apart(tmp_path):
    here = record.machine()
    assert set(here) == {"cpu", "features", "cores", "memory_gib"} and here["cores"] >= 1
    assert set(here["features"]) <= set(record.FEATURES)
    other = dict(here, features=["avx2", "fma", "avx512f"], cores=here["cores"] + 2)
    assert record.differences(here, here) == []
    d = record.differences(other, dict(other, features=["avx2", "fma"]))
    assert d == ["features avx2, fma, avx512f against avx2, fma"]
    assert record.differences({"features": []}, {"features": ["avx2"]})[0] == "features none against avx2"

    built, kept = tmp_path / "generated", tmp_path / "kept"
    built.mkdir()
    _page(built / "04_x.ipynb", {"speed_lazy": "0.93× [0.88, 0.98]"})
    record.keep(built, kept)
    assert record.main(["compare", str(kept), str(built)]) == 0                 # this machine made it
    m = json.loads((kept / "build.json").read_text())
    m["machine"] = other
    (kept / "build.json").write_text(json.dumps(m))
    assert record.main(["compare", str(kept), str(built)]) == 1                 # another machine: refused
    assert record.main(["compare", str(kept), str(built), "--any-machine"]) == 0
    assert record.main(["compare", str(built), str(kept)]) == 1                 # pages, not a kept build
    assert record.main(["compare", str(kept)]) == 2

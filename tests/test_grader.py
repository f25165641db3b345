"""The grader: hostile submissions (tests/hostile/*.py, first line `# expect: CATEGORY`) are graded
0 with the expected reason category, inside the time limit, without writing outside their temp
folder; CLI JSON shape; malformed notebooks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import vramlab
from vramlab.grader.core import grade_file

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = sorted((ROOT / "tests" / "hostile").glob("*.py"))
TIMEOUT = 40   # generous: 2 hostile gradings share 2 cores; the infinite loop is killed at this limit
PWNED = [ROOT / "PWNED_by_hostile.txt", Path("/tmp/PWNED_by_hostile.txt")]
KEYS = {"exercise", "passed", "score", "max_score", "peak_bytes", "baseline_peak_bytes", "ratio", "target_ratio",
        "correct", "reason", "backend", "category"}


def _expect(path: Path) -> str:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect:"), path
    return first.split(":", 1)[1].strip()


@pytest.fixture(scope="module")
def hostile_results(tmp_path_factory):
    import tempfile

    for p in PWNED:
        p.unlink(missing_ok=True)
    private = tmp_path_factory.mktemp("grader-tmp")     # the grader's temp folders go here
    saved, tempfile.tempdir = tempfile.tempdir, str(private)
    grade_file("ch05-accumulation", HOSTILE[0], timeout_s=TIMEOUT, reuse_baseline=True)   # cache the baseline

    def one(path):
        t0 = time.perf_counter()
        r = grade_file("ch05-accumulation", path, timeout_s=TIMEOUT, reuse_baseline=True)
        return path.name, (r, time.perf_counter() - t0)
    try:
        with ThreadPoolExecutor(2) as ex:
            results = dict(ex.map(one, HOSTILE))
    finally:
        tempfile.tempdir = saved
    return results, [p.name for p in private.iterdir()]


@pytest.mark.slow
@pytest.mark.parametrize("path", HOSTILE, ids=[p.stem for p in HOSTILE])
def test_hostile_submission_scores_zero(path, hostile_results):
    results, new_tmp = hostile_results
    r, seconds = results[path.name]
    assert r["score"] == 0 and r["passed"] is False
    assert r["category"] == _expect(path), r["reason"]
    assert r["reason"] and any("\u4e00" <= ch <= "\u9fff" for ch in r["reason"])     # Chinese reason
    assert seconds < TIMEOUT + 40
    for p in PWNED:
        assert not p.exists(), p
    assert not new_tmp, f"temp folders left behind: {new_tmp}"


def test_hostile_fixture_coverage():
    names = {p.stem for p in HOSTILE}
    for required in ("infinite_loop", "huge_alloc", "sys_exit_import", "sys_exit_func", "os_exit_import",
                     "os_exit_func", "patch_max_allocated", "patch_tracker_track", "patch_cuda_memory",
                     "unset_dispatch", "disable_modes", "pause_counter", "host_ctx", "untracked_ctx",
                     "reset_peak", "empty_cache", "stale_cached", "fake_print", "fork_bomb",
                     "read_solution", "import_exercises", "write_course"):
        assert required in names


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "vramlab.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_cli_exercises_json():
    out = _cli("exercises", "--json")
    assert out.returncode == 0, out.stderr
    items = json.loads(out.stdout)
    from vramlab.exercises import EXERCISES
    assert [i["id"] for i in items] == list(EXERCISES) and len(items) == 30
    assert {"id", "chapter", "function", "target_ratio", "points", "notebook", "solution"} <= set(items[0])


def test_cli_malformed_notebook_is_graded_zero(tmp_path):
    bad = tmp_path / "broken.ipynb"
    bad.write_text("{ this is not json", encoding="utf-8")
    out = _cli("grade", "ch05-accumulation", str(bad), "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert KEYS <= set(r) and r["score"] == 0 and r["category"] == "invalid_submission"
    assert "JSON" in r["reason"]


def test_cli_unknown_exercise_exits_nonzero(tmp_path):
    out = _cli("grade", "ch99-nope", str(tmp_path / "x.py"), "--json")
    assert out.returncode != 0 and "未知练习" in out.stderr


def test_cli_grades_a_notebook_with_check_cell(tmp_path):
    from vramlab.exercises import get_exercise
    spec = get_exercise("ch07-checkpoint")
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# 第 7 章"},
                    {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                     "source": spec.solution},
                    {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                     "source": "import vramlab\nvramlab.check('ch07-checkpoint')"}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "ch07-checkpoint.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    out = _cli("grade", "ch07-checkpoint", str(path), "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert KEYS <= set(r)
    assert r["passed"] and r["score"] == r["max_score"] and r["backend"] == "sim", r["reason"]
    human = _cli("grade", "ch07-checkpoint", str(path))
    assert "通过" in human.stdout and "起始代码峰值" in human.stdout


def test_check_is_lazy_and_callable():
    code = "import sys, vramlab; assert 'torch' not in sys.modules; f = vramlab.check; assert callable(f)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    import vramlab.notebook_check as mod
    assert vramlab.check is mod.check
    assert not hasattr(sys.modules["__main__"], "train_step")
    with pytest.raises(AssertionError, match="没有找到函数"):
        vramlab.check("ch05-accumulation")

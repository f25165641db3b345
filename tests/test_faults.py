"""Faults (issue 19): a full temp disk, stop signals, a killed nbgrader autograde, bad arguments.
Each test injects one fault and checks what must hold: no grade lost or turned into the learner's
fault, no folder or process left behind, a clear Chinese message, the documented exit code
(vramlab/errors.py).

The fast tests stub the fault (a small free-space figure, a truncated result file, a signal sent
to this process) and start no process. The slow ones inject it for real: a 2 MiB tmpfs as the
temp disk (root only), SIGTERM / Ctrl-C to a running `vramlab grade`, SIGKILL to `nbgrader
autograde`. Gradings use the cheapest exercise (ch01) without the OS sandbox where the sandbox is
not the point (bubblewrap is not on every machine)."""
from __future__ import annotations

import csv
import errno
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from vramlab import cli, errors
from vramlab.grader import batch
from vramlab.exercises import get_exercise
from vramlab.grader import autograde, core, sandbox
from vramlab.grader import cli as grader_cli

from test_batch import _alive, _subs as batch_subs

ROOT = Path(__file__).resolve().parent.parent
EX = "ch01-estimate"
SOLUTION = ROOT / "solutions" / EX / f"{EX}.ipynb"
ENGLISH = ("Traceback", "usage:", "error:", "Error:", "Errno", "No such file", "No space left")


def _english(text: str) -> list[str]:
    return [w for w in ENGLISH if w in text]


def _run_cli(capsys, *argv) -> tuple[int, str, str]:
    """`vramlab ARGV` in this process: (exit code, stdout, stderr); argparse's exits included."""
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _json_error(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out                       # one JSON object on stdout, nothing else
    doc = json.loads(lines[0])
    assert set(doc) >= {"error", "message", "exit_code"}, doc
    return doc


# ---------------------------------------------------------------------------------------------------
# A full temp disk is the grader's problem, never the learner's
# ---------------------------------------------------------------------------------------------------

def test_free_space_is_checked_before_a_run(tmp_path, monkeypatch):
    """Too little free space: refused before any folder or process exists, in Chinese."""
    monkeypatch.setattr(sandbox.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sandbox, "_free_bytes", lambda folder: 1 << 20)
    monkeypatch.setattr(sandbox.slots, "take", lambda *a: pytest.fail("a sandbox was started"))
    with pytest.raises(sandbox.GraderProblem) as e:
        sandbox.run_job(types.SimpleNamespace(backend="sim"), "def f(): pass\n", 10, 1 << 30, use_sandbox=False)
    assert "磁盘" in str(e.value) and "TMPDIR" in str(e.value) and "1.00 MiB" in str(e.value)
    assert not _english(str(e.value))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", [None, '{"ok": true, "peak_by'], ids=["missing", "truncated"])
def test_a_bad_result_on_a_full_disk_is_a_grader_problem(tmp_path, monkeypatch, content):
    """A result cut short (or never written) while the disk is full: a GraderProblem. With space
    left, the same file is the learner's doing, judged as before (tamper / crashed)."""
    work = tmp_path / "vramlab-slot-x" / "work"
    work.mkdir(parents=True)
    if content is not None:
        (work / "result-0.json").write_text(content, encoding="utf-8")
    monkeypatch.setattr(sandbox, "_free_bytes", lambda folder: 12 * 1024)
    with pytest.raises(sandbox.GraderProblem) as e:
        sandbox._read_results(work, 1)
    assert "12.00 KiB" in str(e.value) and "不是提交的问题" in str(e.value)

    monkeypatch.setattr(sandbox, "_free_bytes", lambda folder: 10 << 30)
    payload = sandbox._read_results(work, 1)[0]
    assert payload is None if content is None else payload["error"]["kind"] == "tamper"
    # the child itself said it ran out of space (another disk, a quota): the grader's problem too
    with pytest.raises(sandbox.GraderProblem):
        sandbox._read_results(work, 1, "OSError: [Errno 28] No space left on device: 'result-0.json'")


def test_a_good_result_is_read_even_on_a_full_disk(tmp_path, monkeypatch):
    (tmp_path / "result-0.json").write_text('{"ok": true, "peak_bytes": 5}', encoding="utf-8")
    monkeypatch.setattr(sandbox, "_free_bytes", lambda folder: 0)
    assert sandbox._read_results(tmp_path, 1) == [{"ok": True, "peak_bytes": 5}]


@pytest.mark.parametrize("failure,needle", [
    (sandbox.GraderProblem("评分用的临时磁盘（/tmp）只剩 8.00 KiB 可用"), "只剩 8.00 KiB"),
    (OSError(errno.EIO, "Input/output error"), "评分器本身出错了：读写出错"),
    (RuntimeError("评分用的常驻进程没有启动：…"), "评分器本身出错了：评分用的常驻进程没有启动"),
])
def test_a_run_that_could_not_be_made_is_a_grader_error_in_chinese(monkeypatch, failure, needle):
    """grade_source raises GraderError (the CLI: exit 4), never a score and no Python class name."""
    def run_job(*args, **kwargs):
        raise failure
    monkeypatch.setattr(core, "run_job", run_job)
    from vramlab.exercises import get_exercise

    with pytest.raises(core.GraderError) as e:
        core.grade_source(EX, get_exercise(EX).solution, sandbox="off", reuse_baseline=False)
    assert needle in str(e.value), str(e.value)
    assert "OSError" not in str(e.value) and "RuntimeError" not in str(e.value) and "GraderProblem" not in str(e.value)


def test_batch_rows_of_grader_errors_have_no_class_names(monkeypatch):
    def grade_file(*a, **kw):
        raise core.GraderError("评分用的临时磁盘（/tmp）只剩 8.00 KiB 可用")
    monkeypatch.setattr("vramlab.grader.grade_file", grade_file)
    row = batch._grade_one(("s0", EX, "x.ipynb"), "sim", "ci", None, "off")
    assert row["category"] == "grader_error" and row["reason"] == "评分用的临时磁盘（/tmp）只剩 8.00 KiB 可用"
    from concurrent.futures.process import BrokenProcessPool

    class Dead:
        def result(self):
            raise BrokenProcessPool("A process in the process pool was terminated abruptly")
    row = batch._result(Dead(), ("s1", EX, "y.ipynb"))
    assert row["category"] == "grader_error" and not _english(row["reason"]) and "BrokenProcessPool" not in row["reason"]


# ---------------------------------------------------------------------------------------------------
# OS errors and argparse in Chinese
# ---------------------------------------------------------------------------------------------------

def test_os_errors_are_chinese():
    assert errors.os_error_zh(FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/a.ipynb")) == "/x/a.ipynb：不存在"
    assert errors.os_error_zh(OSError(errno.ENOSPC, "No space left on device")) == "磁盘空间不足"
    assert errors.os_error_zh(OSError(errno.EXFULL, "Exchange full")) == "系统错误 EXFULL"
    assert errors.describe(PermissionError(errno.EACCES, "Permission denied", "/r")) == "/r：没有权限"


PARSERS = [       # (name, entry point, the arguments it needs besides the bad option)
    ("vramlab", lambda argv: cli.main(argv), ["estimate"]),
    ("vramlab grade", lambda argv: cli.main(["grade", *argv]), [EX, "x.ipynb"]),
    ("python -m vramlab.grader.batch", lambda argv: batch.main(argv), []),
    ("vramlab tutorials", lambda argv: __import__("vramlab.tutorials", fromlist=["main"]).main(argv), ["list"]),
    ("python -m vramlab.grader.autograde", lambda argv: autograde.main(argv), []),
    ("python -m vramlab.notebooks", lambda argv: __import__("vramlab.notebooks", fromlist=["main"]).main(argv), []),
    ("vramlab grade-bench", lambda argv: cli.main(["grade-bench", *argv]), []),
]


@pytest.mark.parametrize("name,entry,needs", PARSERS, ids=[p[0] for p in PARSERS])
def test_every_entry_point_speaks_chinese(capsys, name, entry, needs):
    with pytest.raises(SystemExit) as e:
        entry([*needs, "--no-such-option"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "用法：" in err and "错误：无法识别的参数：--no-such-option" in err, err
    assert not _english(err), err
    with pytest.raises(SystemExit) as e:
        entry(["-h"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "用法：" in out and "显示这段帮助并退出" in out and "show this help" not in out and "options:" not in out


def test_argparse_errors_with_json_are_one_json_object(capsys):
    code, out, err = _run_cli(capsys, "estimate", "--json", "--batch", "zero")
    assert code == 2 and _json_error(out) == {"error": "bad_arguments", "exit_code": 2,
                                             "message": "参数 --batch：需要正整数，收到 'zero'"}
    assert "错误：参数 --batch" in err


# ---------------------------------------------------------------------------------------------------
# vramlab grade: exit codes and --json on every error path
# ---------------------------------------------------------------------------------------------------

@pytest.fixture
def no_grading(monkeypatch):
    """Any grading would be a failure here: these paths must stop before one starts."""
    def refuse(*a, **kw):
        raise AssertionError("a grading started")
    monkeypatch.setattr(core, "grade_file", refuse)
    monkeypatch.setattr(sandbox, "run_job", refuse)


def _unreadable_cases(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "folder.ipynb").mkdir()
    (tmp_path / "empty.ipynb").write_text("", encoding="utf-8")
    (tmp_path / "blank.py").write_text("  \n\n", encoding="utf-8")
    (tmp_path / "binary.ipynb").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "broken.ipynb").write_text('{"cells": [', encoding="utf-8")
    (tmp_path / "notebook.ipynb").write_text('{"not": "a notebook"}', encoding="utf-8")
    return {"missing": tmp_path / "nope.ipynb", "folder": tmp_path / "folder.ipynb", "empty": tmp_path / "empty.ipynb",
            "blank": tmp_path / "blank.py", "binary": tmp_path / "binary.ipynb", "broken": tmp_path / "broken.ipynb",
            "not_a_notebook": tmp_path / "notebook.ipynb"}


@pytest.mark.parametrize("case", ["missing", "folder", "empty", "blank", "binary", "broken", "not_a_notebook"])
def test_grade_an_unreadable_submission_exits_3(tmp_path, capsys, no_grading, case):
    path = _unreadable_cases(tmp_path)[case]
    code, out, err = _run_cli(capsys, "grade", EX, str(path), "--json")
    assert code == errors.EXIT_UNREADABLE == 3
    doc = _json_error(out)
    assert doc["error"] == "unreadable_submission" and doc["exit_code"] == 3 and doc["path"] == str(path)
    assert doc["exercise"] == EX and str(path) in doc["message"] and doc["message"] in err
    assert not _english(err + out)
    code, out, err = _run_cli(capsys, "grade", EX, str(path))      # human output: the same, stdout empty
    assert code == 3 and out == "" and "错误：" in err


@pytest.mark.parametrize("argv,code,kind,needle", [
    (["grade", "ch99-nope", str(SOLUTION)], 2, "bad_arguments", "未知练习"),
    (["grade", EX, str(SOLUTION), "--timeout", "nan"], 2, "bad_arguments", "大于 0 的有限秒数"),
    (["grade", EX, str(SOLUTION), "--timeout", "-5"], 2, "bad_arguments", "大于 0 的有限秒数"),
    (["grade", EX, str(SOLUTION), "--timeout", "0"], 2, "bad_arguments", "大于 0 的有限秒数"),
    (["grade", EX, str(SOLUTION), "--timeout", "inf"], 2, "bad_arguments", "大于 0 的有限秒数"),
    (["grade", EX, str(SOLUTION), "--backend", "cuda"], 4, "grader_error", "没有可用的 GPU"),
    (["estimate", "--model", "gpt5"], 2, "bad_arguments", "未知模型预设"),
    (["estimate", "--seq", "99999"], 2, "bad_arguments", "最多支持"),
    (["measure", "--model", "tiny", "--backend", "cuda"], 4, "grader_error", "没有可用的 GPU"),
], ids=["unknown-exercise", "timeout-nan", "timeout-negative", "timeout-zero", "timeout-inf", "cuda-without-gpu",
        "unknown-model", "impossible-workload", "measure-cuda-without-gpu"])
def test_json_error_paths_print_one_json_object(capsys, monkeypatch, no_grading, argv, code, kind, needle):
    import torch

    monkeypatch.setattr(sandbox, "_cuda_available", False)          # the same on a machine with a GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    got, out, err = _run_cli(capsys, *argv, "--json")
    assert got == code, err
    doc = _json_error(out)
    assert doc["error"] == kind and doc["exit_code"] == code and needle in doc["message"], doc
    assert err.count("错误：") == 1 and needle in err and not _english(err), err


def test_grade_a_grader_failure_exits_4(capsys, monkeypatch):
    def grade_file(*a, **kw):
        raise core.GraderError("评分用的临时磁盘（/tmp）只剩 8.00 KiB 可用，评分需要至少 64.00 MiB")
    monkeypatch.setattr(core, "grade_file", grade_file)
    code, out, err = _run_cli(capsys, "grade", EX, str(SOLUTION), "--json", "--no-sandbox")
    assert code == 4 and _json_error(out)["error"] == "grader_error" and "只剩 8.00 KiB" in err


@pytest.mark.parametrize("flag", [["--optimizer", "sgd"], ["--checkpointing", "full"], ["--lora-rank", "8"],
                                  ["--zero", "1", "--gpus", "2"], ["--accum", "4"], ["--offload", "activations"]],
                         ids=lambda f: f[0])
def test_inference_refuses_training_options(capsys, flag):
    code, out, err = _run_cli(capsys, "estimate", "--inference", *flag, "--json")
    assert code == 2 and flag[0] in _json_error(out)["message"] and "--inference" in err
    code, out, err = _run_cli(capsys, "estimate", *flag, "--json")
    assert code == 0 and "total_bytes" in json.loads(out)                # the same option without --inference


def test_calibrate_and_tutorials_refuse_what_does_not_exist(capsys, monkeypatch):
    import torch

    code, out, err = _run_cli(capsys, "calibrate", "--rows", "nosuchrow", "--json")
    assert code == 2 and "nosuchrow" in _json_error(out)["message"] and "small_fp32_adamw_b8_s512" in err
    code, out, err = _run_cli(capsys, "calibrate", "--backends", "tpu")
    assert code == 2 and "--backends" in err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out, err = _run_cli(capsys, "calibrate", "--backends", "cuda", "--json")
    assert code == 4 and "没有可用的 GPU" in _json_error(out)["message"]
    code, out, err = _run_cli(capsys, "tutorials", "check", "--only", "ch99")
    assert code == 2 and "ch99" in err and "ch01" in err


def test_trace_refuses_bad_paths_and_snapshots(tmp_path, capsys):
    base = ["trace", "--model", "tiny", "--batch", "2", "--seq", "16"]
    code, _, err = _run_cli(capsys, *base, "--out", str(tmp_path))
    assert code == 2 and "是一个文件夹" in err
    code, _, err = _run_cli(capsys, *base, "--out", str(tmp_path / "no" / "such" / "t.json"))
    assert code == 2 and "不存在" in err
    out = str(tmp_path / "t.json")
    code, _, err = _run_cli(capsys, "trace", "--from-cuda-snapshot", str(tmp_path / "none.pickle"), "--out", out)
    assert code == 2 and "none.pickle：不存在" in err
    (tmp_path / "text.pickle").write_text("not a pickle at all\n", encoding="utf-8")
    code, _, err = _run_cli(capsys, "trace", "--from-cuda-snapshot", str(tmp_path / "text.pickle"), "--out", out)
    assert code == 2 and "不是 torch.cuda.memory._dump_snapshot() 保存的快照" in err
    (tmp_path / "list.pickle").write_bytes(pickle.dumps([1, 2, 3]))
    code, _, err = _run_cli(capsys, "trace", "--from-cuda-snapshot", str(tmp_path / "list.pickle"), "--out", out)
    assert code == 2 and "快照" in err
    assert not (tmp_path / "t.json").exists()
    for e in (err,):
        assert not _english(e), e


# ---------------------------------------------------------------------------------------------------
# Stop signals
# ---------------------------------------------------------------------------------------------------

def test_stop_on_signals_raises_once_and_keeps_ignored_signals_ignored():
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)          # as under nohup
    try:
        with errors.stop_on_signals() as caught:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            with pytest.raises(errors.Interrupted) as e:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(2)
            assert e.value.signum == signal.SIGTERM and e.value.exit_code == 143
            os.kill(os.getpid(), signal.SIGINT)                  # a second one during clean-up: noted only
            time.sleep(0.1)
            assert caught == [signal.SIGTERM, signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGHUP, old)


@pytest.mark.parametrize("signame,code", [("SIGTERM", 143), ("SIGHUP", 129), ("SIGINT", 130)])
def test_a_signal_to_vramlab_grade_kills_its_runs(capsys, monkeypatch, signame, code):
    """The command's runs in flight, here one in a thread as core.py runs the starter's beside the
    learner's, are killed (abort_all) and have cleaned up before it exits 128+N, in Chinese."""
    import threading

    killed = threading.Event()

    def run():                      # a run that only ends when it is killed
        with sandbox._tracked(killed.set):
            killed.wait(60)

    def cmd_grade(args):
        t = threading.Thread(target=run)
        t.start()
        while not sandbox.active_runs():
            time.sleep(0.01)
        os.kill(os.getpid(), getattr(signal, signame))
        t.join()
        raise AssertionError("the signal did not stop the command")
    monkeypatch.setattr(grader_cli, "cmd_grade", cmd_grade)
    # a test run under nohup inherits an ignored SIGHUP, which the command rightly keeps ignoring
    default = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    t0 = time.monotonic()
    try:
        got, out, err = _run_cli(capsys, "grade", EX, str(SOLUTION), "--json")
    finally:
        signal.signal(signal.SIGHUP, default)
    assert got == code and killed.is_set() and time.monotonic() - t0 < 30
    assert "已中断" in err and signame in err and "评分进程已结束" in err and not _english(err), err
    assert _json_error(out)["error"] == "interrupted"
    assert sandbox.active_runs() == 0


# ---------------------------------------------------------------------------------------------------
# Folders of killed gradings
# ---------------------------------------------------------------------------------------------------

def test_stale_grading_folders_are_swept(tmp_path):
    now = time.time()

    def folder(name: str, owner: str | None, age: float) -> Path:
        d = tmp_path / name
        (d / "work").mkdir(parents=True)
        (d / "work" / "submission.py").write_text("learner's code\n", encoding="utf-8")
        if owner is not None:
            (d / "owner").write_text(owner, encoding="ascii")
        os.utime(d, (now - age, now - age))
        return d

    me = f"{os.getpid()} {sandbox._start_time(os.getpid())}"
    dead = f"{os.getpid()} 1"                              # this pid, another start time: a process that ended
    gone = [folder("vramlab-grade-dead", dead, 600), folder("vramlab-slot-dead", dead, 600),
            folder("vramlab-batch-dead", dead, 600), folder("vramlab-autograde-dead", dead, 600),
            folder("vramlab-grade-unowned-old", None, 3 * 86400), folder("vramlab-grade-garbled", "x", 600)]
    kept = [folder("vramlab-grade-live", me, 600), folder("vramlab-grade-young", dead, 5),
            folder("vramlab-slot-unowned", None, 600), folder("other-dead", dead, 600)]
    locked = gone[0] / "work" / "locked"
    locked.mkdir()
    (locked / "f").write_text("x")
    locked.chmod(0)                                       # a learner made it unreadable
    (tmp_path / "vramlab-grade-link").symlink_to(kept[0])
    removed = sandbox.sweep_stale(tmp_path)
    assert sorted(removed) == sorted(str(p) for p in gone)
    assert not any(p.exists() for p in gone) and all(p.exists() for p in kept)
    assert (tmp_path / "vramlab-grade-link").is_symlink()


def test_the_cold_grading_folder_is_removed_on_every_path(tmp_path, monkeypatch):
    """A run that fails half-way (here: the child cannot start) leaves no folder behind."""
    monkeypatch.setattr(sandbox.tempfile, "tempdir", str(tmp_path))

    def popen(*a, **kw):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
    monkeypatch.setattr(sandbox.subprocess, "Popen", popen)
    with pytest.raises(OSError):
        sandbox._run_cold(core.make_job(get_exercise("ch01-estimate"), "ci", "sim", 1), "def f(): pass\n", 10, 1 << 30,
                          use_sandbox=False)
    assert list(tmp_path.iterdir()) == []
    assert sandbox.active_runs() == 0


# ---------------------------------------------------------------------------------------------------
# The batch: destination, temp disk and backend before grading; the old CSV never looks current
# ---------------------------------------------------------------------------------------------------

def _subs(tmp_path: Path, n: int) -> list[str]:
    """test_batch's fake submissions, of this file's exercise, as command-line arguments."""
    return [str(p) for p in batch_subs(tmp_path, n, EX)]


@pytest.mark.parametrize("fault", ["full-disk", "no-gpu"])
def test_batch_refuses_a_machine_that_cannot_grade_before_grading(tmp_path, capsys, monkeypatch, fault):
    monkeypatch.setattr(batch, "grade_many", lambda *a, **kw: pytest.fail("grading started"))
    dest = tmp_path / "grades.csv"
    dest.write_text("student\nold\n", encoding="utf-8")
    argv = ["--no-sandbox", "--json", "--csv", str(dest), *_subs(tmp_path, 2)]
    if fault == "full-disk":
        monkeypatch.setattr(sandbox, "_free_bytes", lambda folder: 4096)
    else:
        monkeypatch.setattr(sandbox, "_cuda_available", False)
        argv = ["--backend", "cuda", *argv]
    assert batch.main(argv) == 4
    out, err = capsys.readouterr()
    assert _json_error(out)["exit_code"] == 4
    assert "还没有开始评分" in err and err.count("错误：") == 1 and not _english(err), err
    assert dest.read_text(encoding="utf-8") == "student\nold\n"        # nothing graded: the CSV is left alone


def test_batch_retires_the_old_csv_once_the_journal_is_held(tmp_path, capsys, monkeypatch):
    """Before grading, an earlier CSV becomes <csv>.prev: a batch killed outright leaves no CSV that
    looks current. A batch refused because another holds the journal touches nothing."""
    from concurrent.futures import ThreadPoolExecutor

    dest = tmp_path / "grades.csv"
    journal = Path(f"{dest}.journal.jsonl")
    dest.write_text("student\nold\n", encoding="utf-8")
    held, _ = batch._open_journal(journal)
    try:
        assert batch.main(["--no-sandbox", "--csv", str(dest), *_subs(tmp_path, 2)]) == 2
    finally:
        held.close()
    assert dest.read_text(encoding="utf-8") == "student\nold\n" and not dest.with_name("grades.csv.prev").exists()

    seen = []

    def grade(job, *a, **kw):
        seen.append((dest.exists(), dest.with_name("grades.csv.prev").exists()))
        return {"student": job[0], "exercise": job[1], "path": job[2], "passed": True, "score": 10, "category": "ok"}
    monkeypatch.setattr(batch, "_grade_one", grade)
    with ThreadPoolExecutor(1) as ex:
        batch.grade_many(_subs(tmp_path, 2), journal=journal, executor=ex, sandbox="off", progress=False,
                         started=lambda: batch._retire(dest))
    assert seen == [(False, True), (False, True)]          # while grading: no CSV at the path
    assert dest.with_name("grades.csv.prev").read_text(encoding="utf-8") == "student\nold\n"


def test_batch_exits_4_when_rows_are_grader_errors(tmp_path, capsys, monkeypatch):
    def grade_many(paths, **kw):
        kw["started"]()
        return [{"student": "s0", "exercise": EX, "path": paths[0], "score": 10, "category": "ok"},
                {"student": "s1", "exercise": EX, "path": paths[1], "score": 0, "category": "grader_error",
                 "reason": "评分用的临时磁盘（/tmp）只剩 8.00 KiB 可用"}]
    monkeypatch.setattr(batch, "grade_many", grade_many)
    dest = tmp_path / "grades.csv"
    assert batch.main(["--no-sandbox", "--csv", str(dest), *_subs(tmp_path, 2)]) == 4
    err = capsys.readouterr().err
    assert "1 份是评分器出错" in err and "重跑" in err
    with open(dest, newline="", encoding="utf-8") as f:
        assert [r["category"] for r in csv.DictReader(f)] == ["ok", "grader_error"]


# ---------------------------------------------------------------------------------------------------
# nbgrader: a killed autograde is detected and regraded
# ---------------------------------------------------------------------------------------------------

def _course(tmp_path: Path) -> Path:
    """A course as a killed autograde leaves it. alice: killed while her notebook ran (the folder
    holds nbgrader's sanitized copy, the gradebook no score); bob: killed while his graded
    notebook was written (cut short); erin: her graded notebook is gone although the gradebook has
    her score; carol: graded; dave: not reached."""
    from nbgrader.api import Gradebook

    (tmp_path / "nbgrader_config.py").write_text("# test course\n", encoding="utf-8")
    students = ("alice", "bob", "carol", "dave", "erin")
    for s in students:
        sub = tmp_path / "nbgrader" / "submitted" / s / EX
        sub.mkdir(parents=True)
        (sub / f"{EX}.ipynb").write_text('{"cells": [], "metadata": {}}', encoding="utf-8")
    whole = '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
    for s, text in (("alice", whole), ("bob", '{"cells": [{"cell_type": "co'), ("carol", whole), ("erin", None)):
        graded = tmp_path / "nbgrader" / "autograded" / s / EX
        graded.mkdir(parents=True)
        (graded / "timestamp.txt").write_text("2026-01-15 12:00:00 UTC", encoding="utf-8")
        if text is not None:
            (graded / f"{EX}.ipynb").write_text(text, encoding="utf-8")
    import sqlite3

    db = tmp_path / "nbgrader" / "gradebook.db"
    with sqlite3.connect(db) as con:          # not empty: nbgrader skips stamping it (a process: alembic)
        con.execute("create table placeholder (x)")
    with Gradebook("sqlite:///" + str(db), "vramlab") as gb:
        gb.add_assignment(EX)
        gb.add_notebook(EX, EX)
        gb.add_grade_cell(f"{EX}-check", EX, EX, max_score=10, cell_type="code")
        for s in students:
            gb.add_student(s)
        for s in ("alice", "bob", "carol", "erin"):          # what autograde's init_assignment records
            gb.add_submission(EX, s)
        for s in ("bob", "carol", "erin"):                     # SaveAutoGrades ran for these
            (grade,) = gb.find_submission_notebook(EX, EX, s).grades
            grade.auto_score = 10
        gb.db.commit()
    return tmp_path


@pytest.fixture
def no_lock(monkeypatch):
    monkeypatch.setattr(autograde, "_held_lock", None)
    yield
    if autograde._held_lock is not None:
        autograde._held_lock.close()


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")   # the fixture fills the gradebook by hand
def test_half_graded_submissions_are_found_and_removed(tmp_path, capsys, no_lock):
    course = _course(tmp_path)
    assert [(s, why) for s, _, why in autograde.half_graded(course)] == [
        ("alice", "成绩库里没有分数"), ("bob", f"评分后的 {EX}.ipynb 只写了一半"), ("erin", f"没有评分后的 {EX}.ipynb")]
    assert autograde.main(["--root", str(course)]) == 1
    assert "alice/ch01-estimate：成绩库里没有分数" in capsys.readouterr().out
    assert autograde.main(["--root", str(course), "--fix", EX]) == 0
    graded = course / "nbgrader" / "autograded"
    assert sorted(p.name for p in graded.iterdir() if any(p.iterdir())) == ["carol"]
    assert all((course / "nbgrader" / "submitted" / s / EX / f"{EX}.ipynb").exists() for s in ("alice", "bob", "erin"))
    assert autograde.main(["--root", str(course)]) == 0


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")   # the fixture fills the gradebook by hand
def test_before_nbgrader_recovers_for_autograde_and_warns_before_export(tmp_path, capsys, no_lock):
    import fcntl

    course = _course(tmp_path)
    autograde.before_nbgrader(course, ["export", "--to", "grades.csv"])
    err = capsys.readouterr().err
    assert "alice/ch01-estimate 没有评完" in err and "bob/ch01-estimate" in err and "nbgrader autograde" in err
    # another autograde holds the course's lock: this one must not touch its folders
    (course / "nbgrader" / autograde.LOCK_NAME).touch()
    other = open(course / "nbgrader" / autograde.LOCK_NAME)
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        autograde.before_nbgrader(course, ["autograde", EX])
        assert "另一个 nbgrader autograde" in capsys.readouterr().err
        assert len(autograde.half_graded(course)) == 3
    finally:
        other.close()
    autograde.before_nbgrader(course, ["autograde", "--student", "bob", EX])
    assert "bob/ch01-estimate 上次没有评完" in capsys.readouterr().err
    assert [s for s, _, _ in autograde.half_graded(course)] == ["alice", "erin"]
    autograde.before_nbgrader(course, ["autograde", EX])
    assert autograde.half_graded(course) == []


def test_trusted_regrade_refuses_a_bad_timeout():
    with pytest.raises(ValueError, match="有限秒数"):
        autograde.TrustedRegrade(timeout=float("nan"))
    with pytest.raises(ValueError, match="有限秒数"):
        autograde.TrustedRegrade(timeout=-5.0)


# ---------------------------------------------------------------------------------------------------
# Slow: the faults for real
# ---------------------------------------------------------------------------------------------------

from vramlab.grader.observer import descendants as _descendants  # noqa: E402


def _grade_env(tmp: Path, **extra) -> dict:
    env = dict(os.environ, TMPDIR=str(tmp), VRAMLAB_WARM_PARK_S="0", **extra)
    env.pop("XDG_RUNTIME_DIR", None)
    return env


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc; process groups")
@pytest.mark.parametrize("signame,group,code", [("SIGTERM", False, 143), ("SIGINT", True, 130), ("SIGKILL", False, -9)],
                         ids=["kill-pid", "ctrl-c", "kill-9"])
def test_signal_to_a_running_vramlab_grade(tmp_path, signame, group, code):
    """`scancel` / `docker stop` (SIGTERM to the process) and Ctrl-C (SIGINT to the group) in the
    middle of a grading: the grading's processes (in sessions of their own) are gone, so is its
    folder of learner code, the message is Chinese, the exit code 128+N. SIGKILL cannot be caught:
    the processes still end (parent-death signal, the worker's closed socket) and the folder they
    leave names its dead owner, so the next grading on the machine removes it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "vramlab.cli", "grade", EX, str(SOLUTION), "--no-sandbox", "--json"],
                            cwd=ROOT, env=_grade_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline, seen = time.monotonic() + 120, set()
    while time.monotonic() < deadline and proc.poll() is None and not seen:
        seen = set(_descendants(proc.pid))
        time.sleep(0.05)
    assert seen, "no grading process started"
    time.sleep(1.0)
    seen |= set(_descendants(proc.pid))
    assert any(p.name.startswith("vramlab-") for p in tmp.iterdir())
    (os.killpg if group else os.kill)(proc.pid, getattr(signal, signame))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    # a warm worker killed mid warm-up (importing torch: tens of seconds on a loaded CI machine)
    # notices its closed socket, and ends, when the warm-up is over (worker.main)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and any(_alive(p) for p in seen):
        time.sleep(0.1)
    assert not [p for p in seen if _alive(p)], "a grading process outlived vramlab grade"
    left = [p for p in tmp.iterdir() if p.name != f"vramlab-slots-{os.getuid()}"]
    if signame == "SIGKILL":
        assert left and all((p / "owner").is_file() for p in left), left
        old = time.time() - 2 * sandbox.STALE_AGE_S
        for p in left:
            os.utime(p, (old, old))
        assert sorted(sandbox.sweep_stale(tmp)) == sorted(str(p) for p in left)
        return
    assert "已中断" in err and not _english(err + out), err
    assert json.loads(out)["error"] == "interrupted"
    assert left == []


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2 MiB tmpfs (root only), filled up to `leave` KiB by the test."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode(errors='replace')}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(mnt: Path, leave_kib: int) -> None:
    st = os.statvfs(mnt)
    free_kib = st.f_bavail * st.f_frsize // 1024
    with open(mnt / "filler", "wb") as f:
        f.write(b"\0" * (max(0, free_kib - leave_kib) * 1024))


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="tmpfs")
@pytest.mark.parametrize("min_free", ["64", "0"], ids=["checked-before", "full-during"])
def test_a_full_temp_disk_is_a_grader_error(small_tmpfs, min_free):
    """A correct submission on a nearly full temp disk: exit 4 and a Chinese message (never 0
    points, "tampering" or an OSError traceback), and no folder left on the disk. `min_free` 0
    turns the check before the run off, so that the run itself meets the full disk."""
    _fill(small_tmpfs, 8)
    r = subprocess.run([sys.executable, "-m", "vramlab.cli", "grade", EX, str(SOLUTION), "--no-sandbox", "--json"],
                       cwd=ROOT, env=_grade_env(small_tmpfs, VRAMLAB_MIN_FREE_MIB=min_free), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 4, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["error"] == "grader_error" and "临时磁盘" in doc["message"] and "不是提交的问题" in doc["message"], doc
    assert not _english(r.stderr), r.stderr
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["filler"]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="process groups")
def test_a_killed_autograde_is_regraded_on_rerun(tmp_path):
    """SIGKILL to `nbgrader autograde` while it grades alice: a plain rerun grades alice again
    (nbgrader alone would skip her: "Skipping existing assignment") and the export gives her the
    full score. Without bubblewrap the course's sandboxes are turned off for this trusted answer."""
    from vramlab import notebooks
    from vramlab.exercises import get_exercise

    course = tmp_path / "course"
    course.mkdir()
    shutil.copy2(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    notebooks.write_sources(course, [EX])
    notebooks.release(course, [EX])
    spec = get_exercise(EX)
    import nbformat

    for s in ("alice", "bob"):
        nb = nbformat.read(course / "exercises" / EX / f"{EX}.ipynb", as_version=4)
        (answer,) = [c for c in nb.cells if c.get("id", "").endswith("-answer")]
        answer.source = spec.solution.strip() + "\n"
        d = course / "nbgrader" / "submitted" / s / EX
        d.mkdir(parents=True)
        nbformat.write(nb, d / f"{EX}.ipynb")
        (d / "timestamp.txt").write_text("2026-01-15 12:00:00.000000 UTC")
    from vramlab.grader import policy

    flags = [] if policy.bwrap_path() else ["--SandboxedExecute.require_sandbox=False", "--TrustedRegrade.sandbox=off"]
    env = notebooks.venv_env({"TMPDIR": str(tmp_path), "VRAMLAB_WARM_PARK_S": "0"})
    cmd = notebooks.nbgrader_cmd() + ["autograde", EX, *flags]
    proc = subprocess.Popen(cmd, cwd=course, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    alice = course / "nbgrader" / "autograded" / "alice" / EX
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and not alice.is_dir():
        time.sleep(0.05)
    assert proc.poll() is None, "autograde ended before grading alice"
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)                  # the node is lost: nothing runs any clean-up
    proc.wait()
    # the fault as nbgrader leaves it: alice's folder is there, the gradebook has no score for her
    assert alice.is_dir() and ("alice", EX) in autograde._unscored(course), "not killed half-way through alice"

    r = subprocess.run(cmd, cwd=course, env=env, capture_output=True, text=True, timeout=900)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    assert "alice/ch01-estimate 上次没有评完" in log, log[-4000:]
    out = course / "nbgrader" / "grades.csv"
    r = subprocess.run(notebooks.nbgrader_cmd() + ["export", "--to", str(out)], cwd=course, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "没有评完" not in r.stderr, r.stderr[-4000:]
    rows = {row["student_id"]: row for row in csv.DictReader(out.open(encoding="utf-8"))}
    assert float(rows["alice"]["score"]) == spec.points and float(rows["bob"]["score"]) == spec.points

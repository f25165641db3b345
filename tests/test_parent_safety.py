"""The parent never blocks on what a submission controls (issue 28).

1. Files read back from a grading's folder (grader/safe_read.py): a result file replaced by a FIFO,
   a symbolic link to /dev/zero or to a file outside the folder, a socket, a folder, a huge file,
   a sparse file of 1 TiB apparent size, a file that keeps growing while it is read. Each is
   refused at once (the test fails if a read takes more than a few seconds instead of hanging)
   and judged 0 points with a Chinese reason naming what the file was.
2. A wall-clock deadline for every grading (grader/deadline.py), hooked into `vramlab grade`,
   `vramlab.check()`, nbgrader autograde and the batch: a grading blocked where no time limit of
   the sandbox reaches is that submission's timeout, and the batch grades the others.

The fast tests start no process: the "gradings" that hang are stubs blocked on a FIFO in this
process. The slow ones grade for real: the hostile result fixtures (tests/hostile/result_*.py)
through the sandbox, a batch of five in which one submission blocks its worker (its notebook is a
FIFO), and the batch's last layer (a worker that does not answer is killed by the parent) with a
fake grader, as tests/test_batch.py does.
"""
from __future__ import annotations

import csv
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vramlab import cli
from vramlab.grader import batch
from vramlab.grader import autograde, core, deadline, safe_read, sandbox
from vramlab.grader.observer import RankObservation

from test_batch import _alive, _lines, _subs

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="FIFOs, /proc, O_NOFOLLOW semantics of Linux")
FAST_S = 5.0          # a refused file answers in milliseconds; a blocked read would never answer
PASSING = {"ok": True, "peak_bytes": 1, "violations": [], "error": None, "losses": [1.0]}


def _chinese(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


def _within(seconds: float, fn, *args):
    """fn(*args) in a daemon thread: (its return value or exception, seconds), or a test failure
    if it has not returned after `seconds` (a hung read leaves only a daemon thread behind)."""
    out: dict = {}

    def target():
        t0 = time.monotonic()
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["value"] = e
        out["seconds"] = time.monotonic() - t0

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(seconds)
    assert not th.is_alive(), f"{getattr(fn, '__name__', fn)} still blocked after {seconds} s"
    return out["value"], out["seconds"]


# ---------------------------------------------------------------------------------------------------
# 1. Reading back: one rule for every kind of bad file
# ---------------------------------------------------------------------------------------------------

def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _symlink_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _symlink_outside(path: Path) -> None:
    outside = path.parent.parent / "elsewhere.json"          # a forged, passing result kept outside
    outside.write_text(json.dumps(PASSING), encoding="utf-8")
    path.symlink_to(outside)


def _socket(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()


def _folder(path: Path) -> None:
    path.mkdir()


def _huge(path: Path) -> None:
    path.write_bytes(json.dumps(PASSING).encode() + b" " * sandbox.RESULT_LIMIT)


def _sparse(path: Path) -> None:
    path.write_bytes(json.dumps(PASSING).encode())
    os.truncate(path, 1 << 40)                                 # 1 TiB apparent, no blocks


BAD_FILES = {
    "fifo": (_fifo, "不是普通文件（命名管道）"),
    "symlink_dev_zero": (_symlink_zero, "是符号链接"),
    "symlink_outside": (_symlink_outside, "是符号链接"),
    "socket": (_socket, "不是普通文件（套接字）"),
    "folder": (_folder, "不是普通文件（文件夹）"),
    "huge": (_huge, "大得不正常"),
    "sparse_1tib": (_sparse, "大得不正常（1024.00 GiB"),
}


def _work(tmp_path: Path) -> Path:
    work = tmp_path / "vramlab-slot-x" / "work"
    work.mkdir(parents=True)
    return work


def _judged(payload) -> dict:
    """The verdict core.py gives a run whose (only) rank left `payload` and was observed normally."""
    from vramlab.exercises import get_exercise

    result = core.base_result(get_exercise("ch05-accumulation"), "sim", "ci")
    obs = RankObservation(ns_pid=2, host_pid=2, device_at_ready=0, rss_at_ready=1, hwm=1, written=0)
    run = sandbox.ChildRun(payload, 0, False, 0.1, "", observations=[obs], rank_peaks=[1])
    base = sandbox.ChildRun(PASSING, 0, False, 0.1, "", observations=[obs], rank_peaks=[1])
    return core._child_failed(result, run, 120, base)


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_result_file_scores_zero_without_blocking(tmp_path, case):
    """Each bad result-0.json: read back in milliseconds, judged tamper, 0 points, the reason says
    what the file was (the old reader blocked on the FIFO forever and read /dev/zero until the
    memory ran out; it followed the link to the forged result outside and gave it full marks)."""
    make, needle = BAD_FILES[case]
    work = _work(tmp_path)
    make(work / "result-0.json")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    payloads, seconds = _within(FAST_S, sandbox._read_results, work, 1)
    assert not isinstance(payloads, BaseException), payloads
    assert seconds < 1.0, seconds
    error = payloads[0]["error"]
    assert error["kind"] == "tamper" and needle in error["message"], error
    # nothing of the sparse terabyte or the huge file was read into memory
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 4 * 1024      # KiB
    verdict = _judged(payloads[0])
    assert verdict["category"] == "tamper" and verdict["score"] == 0 and verdict["passed"] is False
    assert needle in verdict["reason"] and _chinese(verdict["reason"]), verdict["reason"]


def test_a_growing_result_file_is_read_only_up_to_the_limit(tmp_path, monkeypatch):
    """A file that grows while it is read (here: by a chunk before every read call, so that it is
    always larger than what has been read): the reader stops at limit + 1 bytes and refuses it."""
    path = tmp_path / "result-0.json"
    path.write_bytes(b"{" + b" " * 1000)
    limit, asked, real_pread = 64 * 1024, [], os.pread

    def pread(fd, n, offset):
        with open(path, "ab") as f:                     # someone keeps appending
            f.write(b" " * 16384)
        asked.append(n)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(safe_read, "CHUNK", 4096)
    monkeypatch.setattr(safe_read.os, "pread", pread)
    with pytest.raises(safe_read.UnsafeFile) as e:
        safe_read.read(path, limit)
    assert "还在变大" in e.value.reason
    assert sum(asked) == limit + 1 and path.stat().st_size > limit


def test_good_files_are_still_read(tmp_path):
    work = _work(tmp_path)
    (work / "result-0.json").write_text(json.dumps(PASSING), encoding="utf-8")
    assert sandbox._read_results(work, 1) == [PASSING]
    # exactly at the limit: read; a byte more: refused
    at_limit = tmp_path / "at-limit"
    at_limit.write_bytes(b"x" * 1000)
    assert safe_read.read(at_limit, 1000) == b"x" * 1000
    with pytest.raises(safe_read.UnsafeFile):
        safe_read.read(at_limit, 999)
    # deeply nested JSON (a RecursionError, not a ValueError) is a malformed result, not a crash
    (work / "result-0.json").write_text("[" * 100000 + "]" * 100000, encoding="utf-8")
    assert sandbox._read_results(work, 1)[0]["error"]["kind"] == "tamper"


def test_log_tails_never_block_or_read_more_than_asked(tmp_path):
    fifo = tmp_path / "stderr.txt"
    os.mkfifo(fifo)
    tail, seconds = _within(FAST_S, sandbox._tail, fifo)
    assert tail == "" and seconds < 1.0
    sparse = tmp_path / "stdout.txt"
    sparse.write_bytes(b"start\n")
    os.truncate(sparse, 1 << 40)
    with open(sparse, "r+b") as f:
        f.seek((1 << 40) - 4)
        f.write(b"end\n")
    tail, seconds = _within(FAST_S, sandbox._tail, sparse, 100)
    assert len(tail) == 100 and tail.endswith("end\n") and seconds < 1.0
    link = tmp_path / "link.txt"
    link.symlink_to("/dev/zero")
    assert _within(FAST_S, sandbox._tail, link)[0] == ""


def test_the_batch_keys_a_fifo_submission_without_blocking(tmp_path):
    """The batch parent reads every submission for its journal key: a FIFO gets none (graded,
    never reused) instead of blocking the parent before any grading starts."""
    (path,) = _subs(tmp_path, 1)
    path.unlink()
    os.mkfifo(path)
    key, seconds = _within(FAST_S, batch.job_key, ("s0", "ch05-accumulation", str(path)), "sim", "ci")
    assert key is None and seconds < 1.0


# ---------------------------------------------------------------------------------------------------
# 2. The deadline (stubs: a "grading" blocked on a FIFO in this process; no child process)
# ---------------------------------------------------------------------------------------------------

@pytest.fixture
def quick_deadline(monkeypatch):
    """Short grace periods, and the kill of the runs in flight recorded instead of done."""
    monkeypatch.setattr(deadline, "GRACE_S", 0.2)
    monkeypatch.delenv(deadline.ENV, raising=False)
    aborted: list[float] = []
    monkeypatch.setattr(sandbox, "abort_all", lambda wait_s=20.0: aborted.append(wait_s) or 0)
    return aborted


def _blocked_on_fifo(tmp_path: Path):
    """A stand-in for a grading stuck where no sandbox limit reaches: open() of a FIFO nobody writes."""
    fifo = tmp_path / "stuck.fifo"
    os.mkfifo(fifo)

    def release():              # should the deadline not work, the test fails after 10 s instead of hanging
        time.sleep(10)
        open(fifo, "wb").close()
    threading.Thread(target=release, daemon=True).start()

    def grading(*args, **kwargs):
        with open(fifo, "rb") as f:
            return f.read()
    return grading


def test_deadline_default_is_the_time_limit_per_case_plus_a_margin(monkeypatch):
    from vramlab.exercises import get_exercise

    monkeypatch.delenv(deadline.ENV, raising=False)
    hidden = len(get_exercise("ch05-accumulation").ci.hidden)
    assert deadline.seconds("ch05-accumulation", "ci") == (1 + hidden) * 120 + deadline.MARGIN_S
    assert deadline.seconds("ch05-accumulation", "ci", timeout_s=10) == (1 + hidden) * 10 + deadline.MARGIN_S
    assert deadline.seconds("ch05-accumulation", "ci", deadline_s=7) == 7
    monkeypatch.setenv(deadline.ENV, "42")
    assert deadline.seconds("ch05-accumulation", "ci") == 42
    assert deadline.seconds("ch05-accumulation", "ci", deadline_s=7) == 7        # the option wins
    for bad in ("0", "-3", "nan", "inf", "soon"):
        monkeypatch.setenv(deadline.ENV, bad)
        with pytest.raises(ValueError, match="VRAMLAB_DEADLINE_S"):
            deadline.seconds("ch05-accumulation", "ci")


def test_a_grading_blocked_in_the_parent_is_a_timeout(tmp_path, quick_deadline):
    """Main thread blocked in open(): the runs are killed at the deadline, then the blocked call is
    interrupted; the verdict is a timeout with 0 points and a Chinese reason."""
    t0 = time.monotonic()
    result = deadline.run(_blocked_on_fifo(tmp_path), "ch05-accumulation", deadline_s=0.5)
    seconds = time.monotonic() - t0
    assert 0.5 <= seconds < 3, seconds
    assert result["category"] == "timeout" and result["score"] == 0 and result["passed"] is False
    assert "总时限" in result["reason"] and _chinese(result["reason"]), result["reason"]
    assert result["exercise"] == "ch05-accumulation" and result["max_score"] > 0
    assert quick_deadline, "the runs in flight were not killed"


def test_a_grading_whose_runs_were_killed_is_a_timeout_not_a_grader_error(quick_deadline, monkeypatch):
    """Off the main thread (no interrupt there): killing the runs is what ends the grading, which
    then fails as a grader error; past the deadline that is the submission's timeout."""
    killed = threading.Event()
    monkeypatch.setattr(sandbox, "abort_all", lambda wait_s=20.0: killed.set() or 1)

    def grading():
        killed.wait(10)
        raise core.GraderError("评分用的常驻进程没有启动")

    result, seconds = _within(10, deadline.run, grading, "ch05-accumulation", "sim", "ci", None, 0.3)
    assert result["category"] == "timeout" and seconds < 3, result


def test_within_the_deadline_nothing_changes(quick_deadline):
    assert deadline.run(lambda: {"passed": True}, "ch05-accumulation", deadline_s=30) == {"passed": True}
    with pytest.raises(core.GraderError):
        deadline.run(lambda: (_ for _ in ()).throw(core.GraderError("x")), "ch05-accumulation", deadline_s=30)
    assert not quick_deadline
    time.sleep(0.3)     # a watchdog outliving its grading would show up as a kill here
    assert not quick_deadline


def test_vramlab_grade_has_a_deadline(tmp_path, quick_deadline, monkeypatch, capsys):
    monkeypatch.setattr(core, "grade_file", _blocked_on_fifo(tmp_path))
    solution = ROOT / "solutions" / "ch05-accumulation" / "ch05-accumulation.ipynb"
    t0 = time.monotonic()
    code = cli.main(["grade", "ch05-accumulation", str(solution), "--deadline", "0.5", "--json"])
    out = capsys.readouterr().out
    assert code == 0 and time.monotonic() - t0 < 5
    doc = json.loads(out)
    assert doc["category"] == "timeout" and doc["score"] == 0 and "总时限" in doc["reason"], doc


def test_a_bad_deadline_is_refused_in_chinese(monkeypatch, capsys):
    solution = ROOT / "solutions" / "ch05-accumulation" / "ch05-accumulation.ipynb"
    monkeypatch.setenv(deadline.ENV, "soon")
    code = cli.main(["grade", "ch05-accumulation", str(solution), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and "VRAMLAB_DEADLINE_S" in doc["message"] and _chinese(doc["message"]), doc
    monkeypatch.delenv(deadline.ENV)
    with pytest.raises(SystemExit) as e:
        cli.main(["grade", "ch05-accumulation", str(solution), "--deadline", "0"])
    assert e.value.code == 2
    assert "时限必须是大于 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="有限秒数"):
        autograde.TrustedRegrade(deadline=-1.0)


def test_check_in_a_notebook_has_a_deadline(tmp_path, quick_deadline, monkeypatch):
    import vramlab
    import vramlab.grader

    monkeypatch.setattr(vramlab.grader, "grade_source", _blocked_on_fifo(tmp_path))
    monkeypatch.setenv(deadline.ENV, "0.5")

    def train_step(model, optimizer, batch, device):
        return 0.0

    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="总时限"):
        vramlab.check("ch05-accumulation", train_step, quiet=True)
    assert time.monotonic() - t0 < 5


def test_autograde_has_a_deadline(tmp_path, quick_deadline, monkeypatch):
    import nbformat

    from vramlab.grader.kernel import DEFER_ENV

    monkeypatch.setenv(DEFER_ENV, "0")                     # TrustedRegrade sets it; restored after the test
    monkeypatch.setattr(core, "grade_file", _blocked_on_fifo(tmp_path))
    cell = nbformat.v4.new_code_cell("vramlab.check('ch05-accumulation')")
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "ch05-accumulation-check", "points": 10,
                                 "solution": False, "locked": True, "schema_version": 3}
    nb = nbformat.v4.new_notebook(cells=[cell])
    step = autograde.TrustedRegrade(deadline=0.5)
    t0 = time.monotonic()
    step.preprocess(nb, {})
    assert time.monotonic() - t0 < 5
    errors = [o for o in cell.outputs if o.get("output_type") == "error"]
    assert len(errors) == 1 and "总时限" in errors[0]["evalue"], cell.outputs


# ---------------------------------------------------------------------------------------------------
# Slow: for real
# ---------------------------------------------------------------------------------------------------

HOSTILE = ROOT / "tests" / "hostile"
# the dense huge file is written in the learner's phase, so the written-bytes check (observer.py: wchar
# + write_bytes, 2 x 20 MiB over a 16 MiB allowance) refuses it before its size is looked at
E2E = {"result_fifo": ("命名管道",), "result_symlink_zero": ("符号链接",), "result_symlink_outside": ("符号链接",),
       "result_sparse": ("大得不正常",), "result_huge": ("大得不正常", "多写出了")}


@pytest.mark.slow
def test_hostile_result_files_are_refused_by_the_parent(tmp_path, monkeypatch):
    """The hostile fixtures graded in the sandbox (the honest accumulation inside each would pass):
    each is 0 points for the file it left, named in the reason, and no grading hangs (the old
    parent blocked forever on the FIFO and read /dev/zero until the memory ran out)."""
    from vramlab.grader import policy

    if policy.bwrap_path() is None:
        pytest.skip("the fixtures reach the result file through the sandbox's folder")
    monkeypatch.setattr(sandbox.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("VRAMLAB_WARM_PARK_S", "0")
    for name, needles in E2E.items():
        t0 = time.monotonic()
        r, _ = _within(300, core.grade_file, "ch05-accumulation", HOSTILE / f"{name}.py", "sim", "ci", 60)
        assert isinstance(r, dict), r
        assert r["score"] == 0 and r["category"] == "tamper", (name, r["reason"])
        assert any(n in r["reason"] for n in needles) and _chinese(r["reason"]), (name, r["reason"])
        print(name, f"{time.monotonic() - t0:.1f} s", r["reason"])


def _process_table() -> set[int]:
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


def _tree(pid: int) -> set[int]:
    from vramlab.grader.observer import descendants

    return set(descendants(pid))


@pytest.mark.slow
def test_a_hanging_submission_in_a_batch_of_five(tmp_path):
    """Five ch01 submissions, one of which is a FIFO: its worker blocks reading it (no sandbox time
    limit reaches there). At the deadline it is that submission's timeout, the other four are
    graded, the CSV has five rows, the journal five intact lines, and no process of the batch is
    left in the process table."""
    ex = "ch01-estimate"
    paths = []
    for i in range(5):
        p = tmp_path / "submitted" / f"s{i}" / ex / f"{ex}.ipynb"
        p.parent.mkdir(parents=True)
        if i == 2:
            os.mkfifo(p)
        else:
            shutil.copy(ROOT / "solutions" / ex / f"{ex}.ipynb", p)
        paths.append(str(p))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out_csv = tmp_path / "grades.csv"
    env = dict(os.environ, TMPDIR=str(tmp), VRAMLAB_WARM_PARK_S="0", VRAMLAB_DEADLINE_GRACE_S="2")
    env.pop("XDG_RUNTIME_DIR", None)
    env.pop("WORKERS", None)
    proc = subprocess.Popen([sys.executable, "-m", "vramlab.grader.batch", "--no-sandbox", "--workers", "2",
                             "--deadline", "120", "--csv", str(out_csv), *paths],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    seen: set[int] = set()
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < 500:
        seen |= _tree(proc.pid)
        time.sleep(0.2)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    with open(out_csv, newline="", encoding="utf-8") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == [f"s{i}" for i in range(5)]
    hung = rows["s2"]
    assert hung["category"] == "timeout" and hung["score"] == "0" and "总时限" in hung["reason"], hung
    for s in ("s0", "s1", "s3", "s4"):
        assert rows[s]["passed"] == "True" and rows[s]["category"] == "ok", rows[s]
    journal = [json.loads(line) for line in _lines(out_csv.with_name("grades.csv.journal.jsonl"))]
    assert sorted(r["student"] for r in journal) == sorted(rows)
    assert seen, "no worker was seen"
    deadline_end = time.monotonic() + 30
    while time.monotonic() < deadline_end and any(_alive(p) for p in seen):
        time.sleep(0.2)
    assert not [p for p in seen if _alive(p)], "a process of the batch outlived it"
    assert [p.name for p in tmp.iterdir()] == [], "temp folders left behind"


HANGBATCH = '''"""python -m hangbatch ARGS: vramlab.grader.batch with a fake grader whose gradings for the students in
HANG never return and take no notice of signals (SIGTERM, the deadline's interrupt): only the
parent's kill of the whole worker ends them. Each grading records "<worker pid> <child pid> <student>"."""
import os
import signal
import subprocess
import sys
import time

import vramlab.grader.batch as batch


def grade(job, backend, scale, timeout_s, sandbox="require", cores=None, deadline_s=None):
    student, exercise, path = job
    hang = student in os.environ.get("HANG", "").split(",")
    child = subprocess.Popen(["sleep", "600" if hang else os.environ["SECONDS_EACH"]], start_new_session=True)
    with open(os.environ["CALLS"], "a") as f:
        f.write(f"{os.getpid()} {child.pid} {student}\\n")
    if hang:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGRTMIN + 5])
        while True:
            time.sleep(1)
    child.wait()
    return {"student": student, "exercise": exercise, "path": path, "passed": True, "score": 10,
            "max_score": 10, "category": "ok", "reason": "", "seconds": float(os.environ["SECONDS_EACH"])}


batch._grade_one = grade
if __name__ == "__main__":
    sys.exit(batch.main())
'''


@pytest.mark.slow
def test_a_worker_that_does_not_answer_is_killed_by_the_parent(tmp_path):
    """The batch's last layer: a grading that ignores everything inside its worker. The parent kills
    that worker and all below it at deadline + 3 x grace (3.5 s here), records the timeout, grades
    again in a fresh pool what the broken pool was running (the other worker is 1 s into s2, its
    second 2.5 s grading, when the pool breaks), and a rerun reuses the timeout row."""
    paths = [str(p) for p in _subs(tmp_path, 5)]
    (tmp_path / "hangbatch.py").write_text(HANGBATCH, encoding="utf-8")
    calls, out_csv, tmp = tmp_path / "calls.txt", tmp_path / "grades.csv", tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), CALLS=str(calls), HANG="s1", SECONDS_EACH="2.5",
               TMPDIR=str(tmp), VRAMLAB_DEADLINE_GRACE_S="0.5")
    env.pop("WORKERS", None)
    argv = [sys.executable, "-m", "hangbatch", "--no-sandbox", "--workers", "2", "--deadline", "2",
            "--csv", str(out_csv), *paths]
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 120
    with open(out_csv, newline="", encoding="utf-8") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert sorted(rows) == [f"s{i}" for i in range(5)]
    assert rows["s1"]["category"] == "timeout" and rows["s1"]["score"] == "0" and "总时限" in rows["s1"]["reason"]
    assert all(rows[s]["category"] == "ok" for s in ("s0", "s2", "s3", "s4")), rows
    assert len(_lines(out_csv.with_name("grades.csv.journal.jsonl"))) == 5
    pids = {int(p) for line in _lines(calls) for p in line.split()[:2]}
    deadline_end = time.monotonic() + 15
    while time.monotonic() < deadline_end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "the hung grading or its worker is still running"
    assert [p.name for p in tmp.iterdir()] == [], "temp folders left behind"
    graded = [line.split()[2] for line in _lines(calls)]
    assert graded.count("s1") == 1 and len(graded) > 5, graded       # a collateral grading was done again
    graded = len(graded)
    r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "已有 5 份成绩" in r.stderr, r.stderr
    assert len(_lines(calls)) == graded, "the timeout row was graded again instead of reused"

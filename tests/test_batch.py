"""vramlab.grader.batch: the journal (one fsynced line per finished grading), resume (reuse what still
matches, regrade what changed), the atomic CSV, the destination check, the command line's errors,
and a clean stop on SIGINT / SIGTERM / SIGHUP (exit 130 / 143 / 129, no traceback, no worker or
grading process left behind, a rerun grades only what is missing); SIGKILL leaves no CSV that
looks current. More faults (full disk, no GPU, grader errors): tests/test_faults.py.

Fast tests run the batch in a thread pool (`executor=`) with a monkeypatched `_grade_one`. The
subprocess tests run the real command line and process pool with a fake grader: a tiny module
written to the test's folder (`fakebatch`) replaces `vramlab.grader.batch._grade_one` and calls `main()`;
the spawned workers import it as their `__main__`, so they run the fake too."""
from __future__ import annotations

import contextlib
import csv
import glob
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from vramlab.grader import batch

ROOT = Path(__file__).resolve().parent.parent
EX = "ch05-accumulation"


def _subs(tmp_path: Path, n: int, exercise: str = EX) -> list[Path]:
    """n fake submissions in nbgrader's layout .../<student>/<exercise>/<exercise>.ipynb"""
    paths = []
    for i in range(n):
        p = tmp_path / "submitted" / f"s{i}" / exercise / f"{exercise}.ipynb"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"submission of s{i}\n", encoding="utf-8")
        paths.append(p)
    return paths


def _row(job, score=10, seconds=0.01) -> dict:
    student, exercise, path = job
    return {"student": student, "exercise": exercise, "path": path, "passed": True, "score": score,
            "max_score": 10, "category": "ok", "reason": "", "seconds": seconds}


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


@pytest.fixture
def calls(monkeypatch):
    """A fake grader that records who it graded."""
    seen: list[str] = []

    def grade(job, backend, scale, timeout_s, sandbox="require", cores=None):
        seen.append(job[0])
        return _row(job)
    monkeypatch.setattr(batch, "_grade_one", grade)
    return seen


def _grade(paths, journal, workers=1, **kw):
    kw.setdefault("progress", False)
    with ThreadPoolExecutor(workers) as ex:
        return batch.grade_many(paths, journal=journal, executor=ex, sandbox="off", **kw)


# -- journal and resume --------------------------------------------------------------------------------

def test_each_grading_is_journaled_as_it_finishes(tmp_path, monkeypatch):
    """The k-th grading starts only after the k-1 before it are lines in the journal (on disk, fsynced)."""
    paths, journal = _subs(tmp_path, 4), tmp_path / "j.jsonl"
    seen_lines: list[int] = []

    def grade(job, backend, scale, timeout_s, sandbox="require", cores=None):
        deadline = time.monotonic() + 3
        while len(_lines(journal)) < len(seen_lines) and time.monotonic() < deadline:
            time.sleep(0.01)
        seen_lines.append(len(_lines(journal)))
        return _row(job)
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else str(fd))
        return real_fsync(fd)
    monkeypatch.setattr(batch, "_grade_one", grade)
    monkeypatch.setattr(os, "fsync", fsync)
    rows = _grade(paths, journal)
    assert seen_lines == [0, 1, 2, 3]
    lines = [json.loads(line) for line in _lines(journal)]
    assert [d["student"] for d in lines] == ["s0", "s1", "s2", "s3"]
    assert all(len(d["key"]) == 64 for d in lines)
    assert [{k: v for k, v in d.items() if k != "key"} for d in lines] == rows
    if os.path.exists("/proc/self/fd"):
        assert synced.count(str(journal)) >= 4


def test_rerun_reuses_journal_rows_without_grading(tmp_path, calls, capsys):
    paths, journal = _subs(tmp_path, 3), tmp_path / "j.jsonl"
    first = _grade(paths, journal)
    assert calls == ["s0", "s1", "s2"]
    capsys.readouterr()
    again = _grade(paths, journal, progress=True)
    assert calls == ["s0", "s1", "s2"]                    # nothing graded a second time
    assert again == first
    err = capsys.readouterr().err
    assert "已有 3 份成绩" in err and "跳过" in err
    assert "本次评分 0 份" in err and "复用已有成绩 3 份" in err
    assert len(_lines(journal)) == 3


def test_changed_submission_backend_or_scale_is_regraded(tmp_path, calls):
    paths, journal = _subs(tmp_path, 3), tmp_path / "j.jsonl"
    _grade(paths, journal)
    paths[1].write_text("a new version\n", encoding="utf-8")
    _grade(paths, journal)
    assert calls == ["s0", "s1", "s2", "s1"]
    _grade(paths, journal, scale="gpu")                    # another scale: another grade
    assert calls[4:] == ["s0", "s1", "s2"]
    assert len(_lines(journal)) == 7


def test_torn_last_journal_line_is_ignored_and_cut(tmp_path, calls):
    paths, journal = _subs(tmp_path, 3), tmp_path / "j.jsonl"
    _grade(paths, journal)
    data = journal.read_bytes()
    last = json.loads(data.splitlines()[-1])["student"]
    journal.write_bytes(data[:-25])                        # a crash in the middle of the last line
    rows = _grade(paths, journal)
    assert calls == ["s0", "s1", "s2", last]
    assert [r["student"] for r in rows] == ["s0", "s1", "s2"]
    lines = [json.loads(line) for line in _lines(journal)]   # every line parses again
    assert sorted(d["student"] for d in lines) == ["s0", "s1", "s2"] and lines[-1]["student"] == last


def test_grader_errors_are_retried_and_fresh_starts_over(tmp_path, monkeypatch):
    paths, journal = _subs(tmp_path, 3), tmp_path / "j.jsonl"
    seen: list[str] = []

    def flaky(job, backend, scale, timeout_s, sandbox="require", cores=None):
        seen.append(job[0])
        if job[0] == "s1" and seen.count("s1") == 1:
            raise RuntimeError("the worker died")          # as a killed worker's future does
        return _row(job)
    monkeypatch.setattr(batch, "_grade_one", flaky)
    rows = _grade(paths, journal)
    assert rows[1]["category"] == "grader_error" and "the worker died" in rows[1]["reason"]
    rows = _grade(paths, journal)
    assert seen == ["s0", "s1", "s2", "s1"] and rows[1]["category"] == "ok"
    _grade(paths, journal, fresh=True)
    assert seen[4:] == ["s0", "s1", "s2"]
    assert len(_lines(journal)) == 3 and len(_lines(journal.with_name("j.jsonl.bak"))) == 4


def test_rows_in_input_order_and_a_failure_is_one_row(tmp_path, monkeypatch):
    paths = _subs(tmp_path, 4)

    def grade(job, backend, scale, timeout_s, sandbox="require", cores=None):
        i = int(job[0][1:])
        time.sleep(0.05 * (4 - i))                         # the last one finishes first
        if i == 2:
            raise RuntimeError("boom")
        return _row(job, score=i)
    monkeypatch.setattr(batch, "_grade_one", grade)
    rows = _grade(paths, None, workers=4)
    assert [r["student"] for r in rows] == ["s0", "s1", "s2", "s3"]
    assert [r["score"] for r in rows] == [0, 1, 0, 3] and rows[2]["category"] == "grader_error"


def test_sandbox_required_without_bubblewrap_refuses(tmp_path, calls, monkeypatch):
    from vramlab.grader import policy

    monkeypatch.setattr(policy, "bwrap_path", lambda: None)
    with pytest.raises(SystemExit) as e:
        batch.grade_many(_subs(tmp_path, 1), sandbox="require", progress=False)
    assert "bubblewrap" in str(e.value.code) and not calls


def test_signal_in_process_stops_cleanly(tmp_path, monkeypatch):
    """SIGINT while grading: Interrupted with the finished rows (all journaled), handlers restored."""
    paths, journal = _subs(tmp_path, 5), tmp_path / "j.jsonl"
    n = []

    def grade(job, backend, scale, timeout_s, sandbox="require", cores=None):
        n.append(job[0])
        if len(n) == 2:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.3)                                # the main thread sees it before this row
        return _row(job)
    monkeypatch.setattr(batch, "_grade_one", grade)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(batch.Interrupted) as e:
        _grade(paths, journal)
    assert e.value.signum == signal.SIGINT and e.value.remaining >= 2
    assert 1 <= len(e.value.rows) == e.value.graded == len(_lines(journal)) <= 3
    assert signal.getsignal(signal.SIGINT) is before


# -- CSV and the command line ---------------------------------------------------------------------------

def test_csv_is_complete_and_replaced_atomically(tmp_path, monkeypatch):
    dest = tmp_path / "out" / "grades.csv"
    dest.parent.mkdir()
    dest.write_text("old,content\n", encoding="utf-8")
    rows = [_row(("s0", EX, "a")), _row(("s1", EX, "b"))]
    replaced = []
    real_replace = os.replace

    def replace(src, dst):
        src, dst = Path(src), Path(dst)
        with open(src, newline="", encoding="utf-8") as f:         # complete before it takes the name
            replaced.append((src.parent, dst, [r["student"] for r in csv.DictReader(f)]))
        assert dest.read_text(encoding="utf-8") == "old,content\n"
        return real_replace(src, dst)
    monkeypatch.setattr(os, "replace", replace)
    batch.write_csv(rows, dest)
    assert replaced == [(dest.parent, dest, ["s0", "s1"])]
    with open(dest, newline="", encoding="utf-8") as f:
        assert [r["student"] for r in csv.DictReader(f)] == ["s0", "s1"]
    assert os.listdir(dest.parent) == ["grades.csv"]

    # a failure half-way leaves the old CSV whole and no temp file
    dest.write_text("old,content\n", encoding="utf-8")
    real_writerow = csv.DictWriter.writerow

    def writerow(self, row):
        if row.get("student") == "s1":
            raise OSError(28, "No space left on device")
        return real_writerow(self, row)
    monkeypatch.setattr(csv.DictWriter, "writerow", writerow)
    with pytest.raises(OSError):
        batch.write_csv(rows, dest)
    assert dest.read_text(encoding="utf-8") == "old,content\n"
    assert os.listdir(dest.parent) == ["grades.csv"]


@pytest.mark.parametrize("case", ["parent_is_a_file", "csv_is_a_folder", "read_only_folder", "journal_elsewhere"])
def test_unwritable_destination_is_refused_before_grading(tmp_path, calls, capsys, case):
    paths = [str(p) for p in _subs(tmp_path, 2)]
    args = ["--no-sandbox", "--csv", str(tmp_path / "grades.csv")]
    if case == "parent_is_a_file":
        (tmp_path / "blocker").write_text("x", encoding="utf-8")
        args = ["--no-sandbox", "--csv", str(tmp_path / "blocker" / "out" / "grades.csv")]
    elif case == "csv_is_a_folder":
        (tmp_path / "grades.csv").mkdir()
    elif case == "read_only_folder":
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder")
        (tmp_path / "ro").mkdir(mode=0o500)
        args = ["--no-sandbox", "--csv", str(tmp_path / "ro" / "grades.csv")]
    else:
        (tmp_path / "blocker").write_text("x", encoding="utf-8")
        args += ["--journal", str(tmp_path / "blocker" / "j.jsonl")]
    assert batch.main(args + paths) == 2
    err = capsys.readouterr().err
    assert "还没有开始评分" in err and "Traceback" not in err, err
    assert not calls


def test_a_second_batch_on_the_same_journal_is_refused(tmp_path, calls, capsys):
    paths = [str(p) for p in _subs(tmp_path, 2)]
    csv_path = tmp_path / "grades.csv"
    held, _ = batch._open_journal(Path(f"{csv_path}.journal.jsonl"))      # another batch is running
    try:
        assert batch.main(["--no-sandbox", "--csv", str(csv_path), *paths]) == 2
    finally:
        held.close()
    err = capsys.readouterr().err
    assert "另一个评分进程" in err and "Traceback" not in err, err
    assert not calls
    again, _ = batch._open_journal(Path(f"{csv_path}.journal.jsonl"))     # once it is gone: fine
    again.close()


@pytest.mark.parametrize("argv,env,needle", [
    (["--workers", "0"], None, "正整数"),
    (["--workers", "abc"], None, "正整数"),
    ([], "abc", "环境变量 WORKERS"),
    ([], "0", "环境变量 WORKERS"),
])
def test_bad_workers_is_a_chinese_error(tmp_path, calls, capsys, monkeypatch, argv, env, needle):
    if env is None:
        monkeypatch.delenv("WORKERS", raising=False)
    else:
        monkeypatch.setenv("WORKERS", env)
    with pytest.raises(SystemExit) as e:
        batch.main(["--no-sandbox", *argv, str(_subs(tmp_path, 1)[0])])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err
    assert not calls


# -- the real command line and process pool, with a fake grader -----------------------------------------

FAKEBATCH = '''"""python -m fakebatch ARGS: vramlab.grader.batch's command line with a fake grader (test helper).
Each grading runs `sleep FAKE_SECONDS` (60 for the students in FAKE_SLOW) in its own session, as
the real grader runs its children, and first records "<worker pid> <child pid> <student>" in FAKE_CALLS."""
import os
import subprocess
import sys
import time

import vramlab.grader.batch as batch


def grade(job, backend, scale, timeout_s, sandbox="require", cores=None):
    student, exercise, path = job
    t0 = time.perf_counter()
    seconds = "60" if student in os.environ.get("FAKE_SLOW", "").split(",") else os.environ["FAKE_SECONDS"]
    child = subprocess.Popen(["sleep", seconds], start_new_session=True)
    with open(os.environ["FAKE_CALLS"], "a") as f:
        f.write(f"{os.getpid()} {child.pid} {student}\\n")
    child.wait()
    return {"student": student, "exercise": exercise, "path": path, "passed": True, "score": 10,
            "max_score": 10, "category": "ok", "reason": "", "seconds": round(time.perf_counter() - t0, 2)}


batch._grade_one = grade
if __name__ == "__main__":
    sys.exit(batch.main())
'''


def _default_hangup():
    """A batch started from a test run under nohup would inherit an ignored SIGHUP, which it rightly
    keeps ignoring; the hang-up case needs the default a terminal's process has."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class FakeClass:
    def __init__(self, tmp_path: Path, n: int):
        self.tmp = tmp_path
        self.paths = [str(p) for p in _subs(tmp_path, n)]
        (tmp_path / "fakebatch.py").write_text(FAKEBATCH, encoding="utf-8")
        self.csv = tmp_path / "grades.csv"
        self.journal = tmp_path / "grades.csv.journal.jsonl"
        self.calls = tmp_path / "calls.txt"
        self.tmpdir = tmp_path / "tmp"                  # the batch's temp folders go here
        self.tmpdir.mkdir()

    def start(self, seconds: float, slow: str = "") -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(self.tmp), str(ROOT)]),
                   FAKE_CALLS=str(self.calls), FAKE_SECONDS=str(seconds), FAKE_SLOW=slow, TMPDIR=str(self.tmpdir))
        env.pop("WORKERS", None)
        return subprocess.Popen([sys.executable, "-m", "fakebatch", "--no-sandbox", "--workers", "2",
                                 "--csv", str(self.csv), *self.paths], cwd=self.tmp, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=_default_hangup)

    def call_lines(self) -> list[list[str]]:
        return [line.split() for line in _lines(self.calls)]

    def journaled(self) -> list[str]:
        return [json.loads(line)["student"] for line in _lines(self.journal)]

    def csv_students(self) -> list[str]:
        with open(self.csv, newline="", encoding="utf-8") as f:
            return [r["student"] for r in csv.DictReader(f)]


def _wait_for(predicate, timeout: float, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the batch ended early: {proc.communicate()}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that is not there counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat, "rb") as f:
                if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                    out.append(int(stat.split("/")[2]))
        except (OSError, ValueError):
            pass
    return out


def _all_gone(pids, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc; signals to process groups")
@pytest.mark.parametrize("signame,group", [("SIGINT", True), ("SIGTERM", False), ("SIGTERM", True), ("SIGHUP", True)],
                         ids=["ctrl-c", "kill-pid", "kill-group", "hang-up"])
@pytest.mark.slow
def test_interrupted_batch_saves_its_rows_and_a_rerun_finishes(tmp_path, signame, group):
    fake = FakeClass(tmp_path, 8)
    proc = fake.start(seconds=1.5)
    _wait_for(lambda: len(_lines(fake.journal)) >= 2, 120, proc)
    started = len(fake.call_lines())
    if group:
        os.killpg(proc.pid, getattr(signal, signame))    # Ctrl-C (the terminal signals the whole group), systemd
    else:
        os.kill(proc.pid, getattr(signal, signame))      # `kill PID`: only the parent
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + getattr(signal, signame), err
    assert "Traceback" not in err + out, err
    assert "已中断" in err and "重新运行" in err and "还剩" in err, err
    done = fake.journaled()
    assert 2 <= len(done) < 8
    assert len(fake.call_lines()) <= started + 2, "gradings went on after the signal"
    assert {json.loads(line)["category"] for line in _lines(fake.journal)} == {"ok"}   # no worker was interrupted
    assert sorted(fake.csv_students()) == sorted(done)          # the CSV holds exactly the finished rows
    pids = {int(p) for w, c, _ in fake.call_lines() for p in (w, c)}
    assert not _all_gone(pids), "a worker or a grading outlived the batch"
    assert not list(fake.tmpdir.iterdir()), "temp folders left behind"

    first_calls = len(fake.call_lines())
    proc = fake.start(seconds=0.2)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    regraded = [s for _, _, s in fake.call_lines()[first_calls:]]
    assert sorted(regraded) == sorted(set(f"s{i}" for i in range(8)) - set(done))   # only the missing ones
    assert sorted(fake.csv_students()) == [f"s{i}" for i in range(8)]
    assert f"已有 {len(done)} 份成绩" in err, err
    assert f"本次评分 {len(regraded)} 份" in err and "中位数" in err and "份/分钟" in err, err


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc; signals to process groups")
def test_ctrl_c_with_an_idle_worker_and_a_long_grading(tmp_path):
    """Ctrl-C reaches every worker: an idle one prints no KeyboardInterrupt traceback, and a grading
    in the middle of a long run is killed at once instead of being waited for."""
    fake = FakeClass(tmp_path, 2)
    proc = fake.start(seconds=0.1, slow="s1")
    _wait_for(lambda: len(_lines(fake.journal)) >= 1, 120, proc)
    time.sleep(0.5)                                       # the worker that graded s0 now waits for work
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 45                     # not the 60 s of s1's grading
    assert proc.returncode == 130 and "Traceback" not in err + out, err
    assert fake.csv_students() == ["s0"] and "还剩 1 份" in err, err
    pids = {int(p) for w, c, _ in fake.call_lines() for p in (w, c)}
    assert not _all_gone(pids), "a worker or a grading outlived the batch"


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_sigint_to_the_workers_alone_is_ignored(tmp_path):
    """Ctrl-C reaches the workers too, from their first instant (while they import, between
    gradings, during one): only the parent acts on it. Here the parent never gets one, so the
    batch finishes as if nothing happened: no traceback, no worker lost."""
    fake = FakeClass(tmp_path, 4)
    proc = fake.start(seconds=0.3)
    while proc.poll() is None:
        for pid in _children(proc.pid):              # the workers (and the resource tracker, which ignores it)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGINT)
        time.sleep(0.01)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err + out, err
    assert {json.loads(line)["category"] for line in _lines(fake.journal)} == {"ok"}
    assert sorted(fake.csv_students()) == ["s0", "s1", "s2", "s3"]
    assert not list(fake.tmpdir.iterdir()), "temp folders left behind"


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_workers_and_gradings_do_not_outlive_a_killed_batch(tmp_path):
    """SIGKILL cannot be caught: the workers notice the parent is gone and end with their gradings;
    what was journaled survives and a rerun grades the rest."""
    fake = FakeClass(tmp_path, 4)
    fake.csv.write_text("student,score\nlast-term,10\n", encoding="utf-8")     # an earlier run's CSV
    proc = fake.start(seconds=60)
    _wait_for(lambda: len(fake.call_lines()) >= 2, 120, proc)       # both workers mid-grading
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    pids = {int(p) for w, c, _ in fake.call_lines() for p in (w, c)}
    assert not _all_gone(pids), "a worker or a grading outlived the batch"
    assert not list(fake.tmpdir.iterdir()), "temp folders left behind"
    assert not fake.csv.exists(), "the earlier CSV still looks like this batch's result"
    assert "last-term" in fake.csv.with_name("grades.csv.prev").read_text(encoding="utf-8")
    proc = fake.start(seconds=0.1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert sorted(fake.csv_students()) == ["s0", "s1", "s2", "s3"]
    assert not list(fake.tmpdir.iterdir()), "temp folders left behind"

"""`vramlab grade-class --slurm` against a real Slurm (issue 32), and its journal logic without one.

The slow test starts a one-machine cluster from Debian's packages (scripts/slurm/single_node.sh:
munged, slurmctld and slurmd on this host, every file in the test's folder; stopped by pid at the
end), grades a class of 6 submissions over 2 cheap exercises through it (one passes each, one
starter fails each, one slow but correct, one broken file), and on the way cancels one array task
with `scancel` while it grades and kills another task's process outright (a node that dies). The
same command again grades only what is missing; the CSV then equals a local batch's on the same
submissions (verdict columns). The commands it runs are the ones docs/guide/grading.md shows.

Without root, slurm-wlm/munge or bubblewrap it says why and skips, except in CI
(VRAMLAB_REQUIRE_SANDBOX=1), where it fails. `make test` installs the packages when it runs as root.
The other tests read hand-written journals and start no process.
"""
from __future__ import annotations

import contextlib
import csv
import glob
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vramlab.grader import slurm

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "slurm" / "single_node.sh"
GUIDE = ROOT / "docs" / "guide" / "grading.md"
VRAMLAB = str(Path(sys.executable).parent / "vramlab")
# what the test runs, as docs/guide/grading.md shows it (the guide must contain these lines verbatim)
COMMAND = "vramlab grade-class --slurm --tasks 2 --cpus-per-task 1 --mem 4G --time 00:10:00 --csv grades.csv sub/*/*/*.ipynb"
ATTACH = "vramlab grade-class --attach {run} --csv grades.csv"
LOCAL = "vramlab grade-class --workers 1 --csv local.csv sub/*/*/*.ipynb"
VERDICT = ("student", "exercise", "path", "score", "max_score", "passed", "category")


# -- the journal logic, without Slurm -------------------------------------------------------------------

def _item(name: str, key: str | None = "k") -> dict:
    return {"student": name, "exercise": "ch01-estimate", "path": f"sub/{name}/ch01-estimate/ch01-estimate.ipynb",
            "key": key and f"{key}-{name}"}


def _row(item: dict, category: str = "ok") -> dict:
    return {"key": item["key"], "student": item["student"], "exercise": item["exercise"], "path": item["path"],
            "passed": category == "ok", "score": 10 if category == "ok" else 0, "max_score": 10, "category": category}


def _journal(state: Path, run: str, task: int, lines: list[dict], torn: str = "") -> None:
    f = state / "runs" / run / "journal" / f"task-{task}.jsonl"
    f.parent.mkdir(parents=True, exist_ok=True)
    with open(f, "a", encoding="utf-8") as out:
        out.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in lines)
        out.write(torn)


def _start(run: str, item: dict) -> dict:
    return {"event": "start", "item": slurm.ident(run, item), "path": item["path"]}


def test_rows_survive_a_cancel_and_only_the_rest_is_missing(tmp_path):
    a, b, c = _item("a"), _item("b"), _item("c")
    _journal(tmp_path, "r1", 0, [{"event": "begin", "node": "n1"}, _start("r1", a), _row(a), _start("r1", b),
                                 {"event": "stopped", "signal": 15}], torn='{"key": "k-c", "stud')
    j = slurm.Journals(tmp_path, ended={"r1"})
    assert slurm.missing("r2", [a, b, c], j) == [1, 2]
    assert not j.strikes                                   # a stop signal is nobody's fault
    assert j.tasks["r1"][0] == {"rows": 1, "last": "stopped", "node": "n1", "message": None}


def test_a_grading_that_kills_its_task_twice_is_that_submissions_crashed_row(tmp_path):
    a, b = _item("a"), _item("b")
    # run 1: the task dies while grading b (no "stopped": killed, out of memory, its node died)
    _journal(tmp_path, "r1", 0, [{"event": "begin"}, _start("r1", a), _row(a), _start("r1", b)])
    j = slurm.Journals(tmp_path, ended=set())
    assert not j.strikes                                   # still running: no verdict yet
    j = slurm.Journals(tmp_path, ended={"r1"})
    assert j.strikes[b["key"]] == 1 and slurm.missing("r2", [a, b], j) == [1]      # once: graded again
    # run 2: requeued by Slurm within the run (a second "begin" in the same file), dies again on b
    _journal(tmp_path, "r2", 0, [{"event": "begin"}, _start("r2", b), {"event": "begin"}, _row(b)])
    j = slurm.Journals(tmp_path, ended={"r1", "r2"})
    assert j.strikes[b["key"]] == 2
    assert slurm.missing("r3", [a, b], j) == []            # the requeued life graded it: its row stands
    assert j.rows[b["key"]]["category"] == "ok"
    # a third file where b kills its task twice without ever finishing
    c = _item("c")
    _journal(tmp_path, "r3", 0, [{"event": "begin"}, _start("r3", c), {"event": "begin"}, _start("r3", c)])
    j = slurm.Journals(tmp_path, ended={"r1", "r2", "r3"})
    assert slurm.missing("r4", [a, b, c], j) == []
    run = {"run": "r4", "items": [a, b, c], "backend": "sim", "scale": "ci"}
    rows, left = slurm.final_rows(run, j)
    assert left == [] and rows[2]["category"] == "crashed" and rows[2]["score"] == 0
    assert "Slurm 数组任务 2 次意外结束" in rows[2]["reason"]


def test_a_refusing_node_or_a_grader_failure_strikes_nobody(tmp_path):
    a = _item("a")
    _journal(tmp_path, "r1", 0, [{"event": "begin"}, {"event": "refused", "message": "没有 GPU"}])
    _journal(tmp_path, "r1", 1, [{"event": "begin"}, _start("r1", a), {"event": "refused", "message": "评分器出错"}])
    j = slurm.Journals(tmp_path, ended={"r1"})
    assert not j.strikes and slurm.missing("r2", [a], j) == [0]
    assert j.tasks["r1"][0]["message"] == "没有 GPU"


def test_grader_errors_and_unreadable_files_are_graded_again(tmp_path):
    a, u = _item("a"), _item("u", key=None)
    _journal(tmp_path, "r1", 0, [_row(a, "grader_error"), _row(u, "invalid_submission")])
    j = slurm.Journals(tmp_path, ended={"r1"})
    assert slurm.missing("r2", [a, u], j) == [0, 1]        # as in the local batch: retried, never reused
    rows, left = slurm.final_rows({"run": "r1", "items": [a, u], "backend": "sim", "scale": "ci"}, j)
    assert left == [] and [r["category"] for r in rows] == ["grader_error", "invalid_submission"]


def test_a_later_run_wins_and_two_runs_never_share_a_file(tmp_path):
    a = _item("a")
    _journal(tmp_path, "20261205-100000-alice-aaaaaa", 0, [_row(a, "grader_error")])
    _journal(tmp_path, "20261205-110000-bob-bbbbbb", 0, [_row(a, "ok")])
    j = slurm.Journals(tmp_path)
    assert j.rows[a["key"]]["category"] == "ok"
    assert sorted(p.parent.parent.name for p in tmp_path.glob("runs/*/journal/task-0.jsonl")) == [
        "20261205-100000-alice-aaaaaa", "20261205-110000-bob-bbbbbb"]


def test_the_array_passes_slurm_options_through_and_tasks_follow_their_allocation(tmp_path):
    args = slurm.build_parser().parse_args(["--slurm", "--partition", "gpu", "--time", "01:00:00", "--cpus-per-task", "8",
                                            "--mem", "32G", "--gres", "gpu:1", "--max-running", "4",
                                            "--sbatch-arg=--account=course42", "x.ipynb"])
    argv = slurm._sbatch_argv(args, tmp_path, 3)
    assert argv[0] == "sbatch" and "--array=0-2%4" in argv and argv[-1] == str(tmp_path / "job.sh")
    for option in ("--partition=gpu", "--time=01:00:00", "--cpus-per-task=8", "--mem=32G", "--gres=gpu:1",
                   "--account=course42", f"--output={tmp_path / 'logs' / '%A_%a.out'}"):
        assert option in argv
    script = slurm.JOB_SH.format(run="r", python="py", run_dir="d")
    assert "export VRAMLAB_WARM_PARK_S=0" in script                       # no warm sandbox outlives its task
    assert "VRAMLAB_GRADE_CORES=$SLURM_CPUS_PER_TASK" in script         # torch threads follow the allocation
    run = {"todo": [4, 5, 6, 7, 8, 9, 10], "tasks": 3}
    assert [slurm.share(run, k) for k in range(3)] == [[4, 7, 10], [5, 8], [6, 9]]


def test_local_mode_refuses_slurm_options(capsys):
    with pytest.raises(SystemExit) as e:
        slurm.main(["--partition", "gpu", "x.ipynb"])
    assert e.value.code == 2 and "--partition 只能和 --slurm 或 --attach 一起用" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        slurm.main(["--slurm", "--journal", "j.jsonl", "x.ipynb"])
    assert "不能用 --journal" in capsys.readouterr().err


# -- a real cluster ---------------------------------------------------------------------------------------

def _why_no_slurm() -> str | None:
    from vramlab.grader import policy

    if os.geteuid() != 0:
        return "Slurm 测试需要 root（单机集群的 SlurmUser=root，munged 以 munge 用户运行）"
    for name in ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel"):
        if shutil.which(name) is None and not Path("/usr/sbin", name).exists():
            return f"没有 {name}：Slurm 测试需要 Debian 的 slurm-wlm 和 munge（make test 以 root 运行时会安装）"
    if policy.bwrap_path() is None:
        return "没有 bubblewrap：集群上的评分和本机一样在沙箱里进行"
    return None


def _pids(folder: Path) -> dict[str, int]:
    return {f.stem: int(f.read_text()) for f in folder.glob("*.pid") if f.read_text().strip().isdigit()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A one-machine Slurm from Debian's packages; yields the environment its clients need."""
    why = _why_no_slurm()
    if why:
        if os.environ.get("VRAMLAB_REQUIRE_SANDBOX"):
            pytest.fail(why)
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("slurm")
    t0 = time.monotonic()
    started = subprocess.run(["bash", str(SCRIPT), "start", str(folder)], capture_output=True, text=True, timeout=120)
    daemons = _pids(folder)
    try:
        assert started.returncode == 0, started.stderr + "".join(
            f.read_text(errors="replace")[-2000:] for f in (folder / "log").glob("*.log"))
        print(f"\n单机 Slurm 已启动（{time.monotonic() - t0:.1f} 秒）：{started.stdout.strip()}")
        yield {**os.environ, "SLURM_CONF": str(folder / "slurm.conf"), "PATH": f"{Path(VRAMLAB).parent}:{os.environ['PATH']}"}
    finally:
        stopped = subprocess.run(["bash", str(SCRIPT), "stop", str(folder)], capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert set(daemons) == {"munged", "slurmctld", "slurmd"}, daemons
        assert not [name for name, pid in daemons.items() if _alive(pid)], "a daemon outlived stop"


def _argv(command: str, cwd: Path, **fill) -> list[str]:
    """A guide command as argv: `vramlab` is this venv's, `sub/*/*/*.ipynb` expanded in `cwd` as a shell would."""
    out = []
    for word in shlex.split(command.format(**fill)):
        out += sorted(glob.glob(word, root_dir=cwd)) if "*" in word else [VRAMLAB if word == "vramlab" else word]
    return out


def _class(folder: Path) -> None:
    """6 submissions over ch01-estimate and ch05-accumulation, in nbgrader's layout."""
    def put(student: str, exercise: str, nb: dict | str) -> None:
        p = folder / "sub" / student / exercise / f"{exercise}.ipynb"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(nb if isinstance(nb, str) else json.dumps(nb, ensure_ascii=False), encoding="utf-8")

    def notebook(kind: str, exercise: str) -> dict:
        return json.loads((ROOT / kind / exercise / f"{exercise}.ipynb").read_text(encoding="utf-8"))

    for exercise in ("ch01-estimate", "ch05-accumulation"):
        put("alice", exercise, notebook("solutions", exercise))          # passes
        put("bob", exercise, notebook("exercises", exercise))            # the starter: fails
    slow = notebook("solutions", "ch01-estimate")                         # correct, about 10 s more to grade
    slow["cells"].insert(4, {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": (
        "import time as _time\n_exact = estimate_static_bytes\n\n"
        "def estimate_static_bytes(n_params, optimizer, precision):\n"
        "    _time.sleep(1.0)\n    return _exact(n_params, optimizer, precision)\n")})
    put("carol", "ch01-estimate", slow)
    put("carol", "ch05-accumulation", '{"cells": [')                        # not a notebook: invalid_submission


def _journal_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def _wait_for(what, timeout: float = 300, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the command ended (exit {proc.returncode}) before {what.__doc__}: {proc.stderr.read()[-3000:]}")
        found = what()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what.__doc__}")


def _csv(path: Path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        return [{k: r[k] for k in VERDICT} for r in csv.DictReader(f)]


def _leftovers(job_ids: set[str], tmp: Path) -> list[str]:
    """Processes of these arrays still alive: their environment names the job, or (a sandbox, whose
    environment is scrubbed) their command line names the tasks' temp folder. A parked warm sandbox
    would be one (VRAMLAB_WARM_PARK_S=0 in job.sh)."""
    left = []
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            cmdline = Path(proc, "cmdline").read_bytes()
            environ = Path(proc, "environ").read_bytes()
        except OSError:
            continue
        env = dict(e.split(b"=", 1) for e in environ.split(b"\0") if b"=" in e)
        if env.get(b"SLURM_ARRAY_JOB_ID", b"").decode() in job_ids or str(tmp).encode() in cmdline:
            words = cmdline.replace(b"\0", b" ")[:120].decode(errors="replace")
            left.append(f"{proc.split('/')[2]} {words}")
    return left


@pytest.mark.slow
def test_a_class_graded_on_slurm_survives_a_cancel_and_a_dead_task_and_equals_the_local_batch(cluster, tmp_path):
    from vramlab.grader import cgroup

    _class(tmp_path)
    tmp = tmp_path / "tmp"                  # the tasks' grading folders: what is left of them is found by this path
    tmp.mkdir()
    cluster = {**cluster, "TMPDIR": str(tmp)}
    extra = [] if cgroup.available() else ["--no-cgroup"]       # as the local batch below: same accounting
    if extra:
        print(f"没有内存 cgroup（{cgroup.why_not()}）：Slurm 和本机批量评分都加 --no-cgroup")
    state = tmp_path / "grades.csv.slurm"
    t0 = time.monotonic()

    # 1. the command waits; meanwhile task 0 is cancelled in its third grading, task 1's process killed in its first
    first = subprocess.Popen(_argv(COMMAND, tmp_path) + extra, cwd=tmp_path, env=cluster, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        def submitted():
            """the array's run.json with its job id"""
            for f in state.glob("runs/*/run.json"):
                with contextlib.suppress(ValueError):
                    d = json.loads(f.read_text(encoding="utf-8"))
                    return d["job_id"] and (f.parent, d)
        run_dir, run = _wait_for(submitted, 60, first)
        assert run["tasks"] == 2 and len(run["todo"]) == 6
        for option in ("--array=0-1", "--cpus-per-task=1", "--mem=4G", "--time=00:10:00"):
            assert option in run["sbatch"]
        task0, task1 = run_dir / "journal" / "task-0.jsonl", run_dir / "journal" / "task-1.jsonl"

        def slow_started():
            """task 0 grading carol's slow submission"""
            return any(d.get("event") == "start" and "carol/ch01" in d["path"] for d in _journal_lines(task0))

        def first_started():
            """task 1 grading its first submission"""
            return next((d for d in _journal_lines(task1) if d.get("event") == "start"), None)

        started = _wait_for(first_started, proc=first)
        begin = next(d for d in _journal_lines(task1) if d.get("event") == "begin")
        time.sleep(1)
        os.kill(begin["pid"], signal.SIGKILL)                      # the task's own process: as if its node died
        _wait_for(slow_started, proc=first)
        time.sleep(1)
        subprocess.run(["scancel", f"{run['job_id']}_0"], env=cluster, check=True, timeout=60)
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    lines0 = _journal_lines(task0)
    rows0 = [d for d in lines0 if "key" in d]
    assert first.returncode == 4, err[-3000:]
    assert [d["student"] for d in rows0] == ["alice", "bob"] and lines0[-1]["event"] == "stopped" and lines0[-1]["signal"] == 15
    assert not [d for d in _journal_lines(task1) if "key" in d] and _journal_lines(task1)[-1]["event"] == "start"
    assert "被取消" in err and "还有 4 份没有评完" in err, err[-3000:]
    assert len(_csv(tmp_path / "grades.csv")) == 2
    first_s = time.monotonic() - t0

    # 2. the same command again (returning at once): an array for the 4 missing submissions only; then attach
    t1 = time.monotonic()
    again = subprocess.run(_argv(COMMAND, tmp_path) + extra + ["--no-wait"], cwd=tmp_path, env=cluster, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    second = json.loads((state / "runs" / again.stdout.strip() / "run.json").read_text())
    resumed = [second["items"][i]["path"] for i in second["todo"]]
    assert sorted(resumed) == sorted(["sub/carol/ch01-estimate/ch01-estimate.ipynb", started["path"],
                                      "sub/bob/ch05-accumulation/ch05-accumulation.ipynb",
                                      "sub/carol/ch05-accumulation/ch05-accumulation.ipynb"])
    assert second["tasks"] == 2 and "另有 2 份已有成绩，不再评" in again.stderr
    attached = subprocess.run(_argv(ATTACH, tmp_path, run=second["run"]), cwd=tmp_path, env=cluster, capture_output=True, text=True,
                              timeout=600)
    assert attached.returncode == 0, attached.stderr[-3000:]
    strikes = slurm.Journals(state, ended={run["run"], second["run"]}).strikes
    assert dict(strikes) == {started["item"]: 1}                  # the killed task's grading: retried once, not blamed
    resume_s = time.monotonic() - t1
    jobs = {run["job_id"], second["job_id"]}
    for _ in range(50):
        left = _leftovers(jobs, tmp)
        if not left:
            break
        time.sleep(0.2)
    assert not left, f"processes of the arrays outlived them: {left}"

    # 3. the local batch on the same submissions: the same verdicts
    t2 = time.monotonic()
    # no parked sandbox left behind in the test's temp folder (conftest ends only those of the default one)
    local = subprocess.run(_argv(LOCAL, tmp_path) + extra, cwd=tmp_path, env={**cluster, "VRAMLAB_WARM_PARK_S": "0"},
                           capture_output=True, text=True, timeout=600)
    assert local.returncode == 0, local.stderr[-3000:]
    on_slurm, on_this_machine = _csv(tmp_path / "grades.csv"), _csv(tmp_path / "local.csv")
    assert on_slurm == on_this_machine
    assert [(r["student"], r["exercise"], r["category"]) for r in on_slurm] == [
        ("alice", "ch01-estimate", "ok"), ("alice", "ch05-accumulation", "ok"),
        ("bob", "ch01-estimate", "incorrect"), ("bob", "ch05-accumulation", "technique"),
        ("carol", "ch01-estimate", "ok"), ("carol", "ch05-accumulation", "invalid_submission")]
    print(f"第一个数组：作业 {run['job_id']}，{run['tasks']} 个任务 / {len(run['todo'])} 份；任务 0 评完 2 份后在第 3 份中被 scancel，"
          f"任务 1 的进程在第 1 份中被 SIGKILL；命令退出码 {first.returncode}，CSV 2 行（{first_s:.0f} 秒）")
    print(f"同一条命令重跑：作业 {second['job_id']}，{second['tasks']} 个任务 / {len(second['todo'])} 份（只补评缺的），"
          f"--attach 退出码 0，CSV 6 行（{resume_s:.0f} 秒）")
    print(f"本机批量评分 {time.monotonic() - t2:.0f} 秒：{len(on_slurm)} 行的 {', '.join(VERDICT)} 与 Slurm 的完全相同")


def test_the_guide_shows_the_commands_this_test_runs():
    text = GUIDE.read_text(encoding="utf-8")
    for command in (COMMAND, ATTACH.format(run="<运行编号>"), LOCAL, "scripts/slurm/single_node.sh start",
                    "scripts/slurm/single_node.sh stop"):
        assert command in text, command


def test_without_slurm_commands_the_slurm_mode_says_so_in_chinese(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    code = slurm.main(["--slurm", "--csv", str(tmp_path / "g.csv"), "x.ipynb"])
    assert code == 4 and "找不到 squeue" in capsys.readouterr().err
    code = slurm.main(["--attach", "r1", "--json", "--csv", str(tmp_path / "g.csv")])
    out = capsys.readouterr().out
    assert code == 4 and json.loads(out)["exit_code"] == 4

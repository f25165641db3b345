"""Warm sandboxes (vramlab/grader/slots.py) and the kept starter runs (baselines.py).

A slot is reused between gradings of different learners: nothing of one grading may reach the
next. A kept starter run is trusted only when it is exactly the one asked for.
"""
import json
import os

import pytest

from vramlab.exercises import get_exercise
from vramlab.grader import baselines, observer, slots
from vramlab.grader.sandbox import ChildRun


def _run(unexplained_mib: int = 0, ok: bool = True) -> ChildRun:
    obs = observer.RankObservation(ns_pid=2, host_pid=100, device_at_ready=0, rss_at_ready=100 * 2**20,
                                   hwm=(300 + unexplained_mib) * 2**20, written=0)
    return ChildRun({"ok": ok, "peak_bytes": 200 * 2**20, "violations": []}, 0, False, 1.0, "", None, [obs],
                    [200 * 2**20])


def test_a_kept_run_comes_back_only_for_its_own_key(tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(baselines, "_memory", {})
    from vramlab.grader.core import make_job

    spec = get_exercise("ch05-accumulation")
    job = make_job(spec, "ci", "sim", 1).with_(batch=8)
    k = baselines.key(spec.id, "ci", "sim", True, job, spec.starter)
    assert k != baselines.key(spec.id, "ci", "sim", True, job.with_(batch=9), spec.starter)
    assert k != baselines.key(spec.id, "ci", "sim", False, job, spec.starter)
    assert k != baselines.key(spec.id, "ci", "sim", True, job, spec.starter + "\n# changed\n")
    baselines.store(k, _run())
    monkeypatch.setattr(baselines, "_memory", {})               # a new process: read from disk
    assert baselines.load(k).payload["peak_bytes"] == 200 * 2**20
    path = tmp_path / "baselines" / f"{k}.json"
    doc = json.loads(path.read_text())

    def load_after(change):
        monkeypatch.setattr(baselines, "_memory", {})
        d = json.loads(json.dumps(doc))
        change(d)
        path.write_text(json.dumps(d))
        return baselines.load(k)
    assert load_after(lambda d: d.update(key="0" * 64)) is None                 # another key's file
    assert load_after(lambda d: d["run"]["payload"].update(ok=False)) is None    # not a clean run
    assert load_after(lambda d: d["run"].update(timed_out=True)) is None
    assert load_after(lambda d: d["run"].pop("observations")) is not None       # (optional field)
    assert load_after(lambda d: d["run"].update(bogus=1)) is None               # not a ChildRun
    monkeypatch.setattr(baselines, "_memory", {})
    path.write_text('{"format": 1, "key": "')                                   # cut short
    assert baselines.load(k) is None


def test_the_noisier_of_two_starter_runs_is_kept():
    quiet, noisy = _run(2), _run(9)
    assert baselines.noisier(quiet, noisy) is noisy and baselines.noisier(noisy, quiet) is noisy


def _bare_slot(tmp_path) -> slots.Slot:
    slot = slots.Slot.__new__(slots.Slot)          # no process: only the folder logic
    slot.work = tmp_path / "work"
    for name in ("tmp", "shm"):
        (slot.work / name).mkdir(parents=True)
    slot.folders = {n: os.lstat(slot.work / n).st_ino for n in ("tmp", "shm")}
    (slot.work / "tmp" / "ci" / "main" / ".venv").mkdir(parents=True)   # bwrap's mount point for a venv under /tmp
    slot.skeleton = {str(slot.work / "tmp" / "ci"), str(slot.work / "tmp" / "ci" / "main"),
                     str(slot.work / "tmp" / "ci" / "main" / ".venv")}
    return slot


def test_a_slot_folder_is_emptied_between_gradings(tmp_path):
    slot = _bare_slot(tmp_path)
    (slot.work / "result-0.json").write_text("{}")
    (slot.work / "tmp" / "leak.bin").write_bytes(b"x" * 100)
    (slot.work / "tmp" / "deep" / "er").mkdir(parents=True)
    (slot.work / "tmp" / "deep" / "er").chmod(0)                          # made unreadable: still removed
    (slot.work / "link").symlink_to(tmp_path)                             # a link is removed, not followed
    (slot.work / "tmp" / "ci" / "main" / "learner.txt").write_text("x")
    assert slot.prepare()
    assert sorted(os.listdir(slot.work)) == ["shm", "tmp"] and os.listdir(slot.work / "tmp") == ["ci"]
    assert os.listdir(slot.work / "tmp" / "ci" / "main") == [".venv"]      # mount points stay, the rest goes
    assert tmp_path.exists()


@pytest.mark.parametrize("tamper", ["symlink", "replaced"])
def test_a_slot_whose_tmp_was_swapped_is_not_reused(tmp_path, tamper):
    slot = _bare_slot(tmp_path)
    os.rename(slot.work / "tmp", slot.work / "old")
    if tamper == "symlink":
        (slot.work / "tmp").symlink_to(tmp_path)
    else:
        (slot.work / "tmp").mkdir()            # same name, another folder: the sandbox's /tmp is the old one
    assert not slot.prepare()


LEAVE_BEHIND = '''
import os
open("/tmp/left-by-another-learner", "w").write("x")
open("left-by-another-learner", "w").write("x")
'''
FIND_NOTHING = '''
import os
for p in ("/tmp/left-by-another-learner", "/submission/left-by-another-learner"):
    if os.path.exists(p):
        raise RuntimeError("LEAKED " + p)
'''


@pytest.mark.slow
def test_nothing_of_one_grading_reaches_the_next_in_the_same_warm_sandbox():
    from vramlab.grader.core import grade_source

    spec = get_exercise("ch05-accumulation")
    grade_source(spec.id, spec.solution)                                   # a warm slot, a kept starter run
    idle = {id(s) for group in slots._idle.values() for s in group}
    first = grade_source(spec.id, LEAVE_BEHIND + spec.solution)
    assert first["passed"], first["reason"]
    second = grade_source(spec.id, FIND_NOTHING + spec.solution)
    assert second["passed"] and "LEAKED" not in second["reason"], second["reason"]
    assert second.get("baseline_cached") is True
    assert idle & {id(s) for group in slots._idle.values() for s in group}     # a slot was reused


# -- parking: a slot left by one process for the next ------------------------------------------------
GRADE_IN_A_NEW_PROCESS = """
import json, sys
from vramlab.exercises import get_exercise
from vramlab.grader import slots
from vramlab.grader.core import grade_source
taken = []
real_take = slots.take
slots.take = lambda *a: taken.append(real_take(*a)) or taken[-1]
spec = get_exercise("ch05-accumulation")
r = grade_source(spec.id, spec.solution)
slots_used = list({id(s): s for s in taken}.values())       # the hidden case takes the same slot again
print(json.dumps({"passed": r["passed"], "parked": [isinstance(s.proc, slots._Parked) for s in slots_used]}))
"""


def _grade_in_a_new_process(env) -> dict:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", GRADE_IN_A_NEW_PROCESS], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_process_takes_over_the_slot_the_previous_one_parked(tmp_path):
    """The next process (a new `vramlab grade`, a new kernel's check()) claims the warm sandbox the
    last one left instead of importing torch again; the grading is the same."""
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path), VRAMLAB_WARM_PARK_S="60")
    first = _grade_in_a_new_process(env)          # 1 slot, or 3 when the starter is measured too
    assert first["passed"] and not any(first["parked"])
    folder = tmp_path / f"vramlab-slots-{os.getuid()}"
    parked = min(len(first["parked"]), slots.MAX_PARKED)
    assert len(list(folder.glob("*.json"))) == parked and oct(folder.stat().st_mode & 0o777) == "0o700"
    second = _grade_in_a_new_process(env)
    assert second["passed"] and second["parked"] == [True]
    import subprocess
    import sys
    code = "from vramlab.grader import slots; print(slots.end_parked())"
    ended = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert ended.stdout.strip() == str(parked) and not list(folder.glob("*"))    # records and sockets gone


def _parked_slot(monkeypatch, tmp_path) -> tuple[slots.Slot, dict]:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(slots, "PARK_S", 60.0)
    slot = slots.Slot(gpu=False, use_sandbox=True)
    assert slot.wait_warm() and slot.prepare()
    assert slot.park()
    (record,) = slots.park_dir().glob("*.json")
    return slot, json.loads(record.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("tamper", ["process", "folder", "replaced", "version"])
def test_a_parked_slot_that_changed_is_never_claimed(monkeypatch, tmp_path, tamper):
    """A record whose worker is not the one recorded, a sandbox holding a process it should not,
    or a folder swapped while parked: the claimant kills the slot. Another checkout's slot is left
    alone for its owner."""
    slot, record = _parked_slot(monkeypatch, tmp_path)
    path = next(slots.park_dir().glob("*.json"))
    if tamper == "process":            # the sandbox holds a process the record does not own
        record["own_pids"] = [record["pid"]]
    elif tamper == "folder":
        os.rename(slot.work / "tmp", slot.work / "tmp-old")
        (slot.work / "tmp").mkdir()
    elif tamper == "replaced":         # the pid now names another process (a start time that is not its)
        record["start"] = int(record["start"]) + 1
    else:
        record["version"] = "0" * 64
    path.write_text(json.dumps(record))
    claimed = slots._claim_parked((False, True))
    try:
        assert claimed is None
        if tamper == "version":
            assert path.exists() and slot.proc.poll() is None        # not ours: untouched
        else:
            assert not path.exists()
            if tamper != "replaced":
                slot.proc.wait(timeout=10)                            # killed, not left running
    finally:
        slot.close()


@pytest.mark.slow
def test_a_warm_grading_moves_its_rank_into_the_cgroup_while_it_builds(monkeypatch):
    """The rank goes into its memory cgroup at `started` (cgroup.py: the move's grace period is
    then spent while the rank builds its model, not while the parent waits to say `go`), and the
    sweep after the grading leaves no process of the grading behind."""
    from vramlab.grader import cgroup, sandbox
    from vramlab.grader.core import make_job

    if cgroup.available() is None or not slots.ENABLED:
        pytest.skip(f"不能创建内存 cgroup：{cgroup.why_not()}")
    seen = []
    monkeypatch.setattr(sandbox, "merge_ranks", lambda run, payloads, _merge=sandbox.merge_ranks:
                        (seen.append(run), _merge(run, payloads))[1])
    spec = get_exercise("ch01-estimate")
    run = sandbox.run_job(make_job(spec, "ci", "sim"), spec.solution, 60, 4 << 30)
    assert run.payload and run.payload.get("ok"), run.stderr_tail
    obs = seen[-1].observations[0]
    assert obs.in_group and obs.cgroup_peak is not None and obs.cgroup_base > 0
    assert not [p for group in slots._idle.values() for s in group
                for p in observer.descendants(s.proc.pid, living=True) if p not in s.own_pids]

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
    spec = get_exercise("ch05-accumulation")
    k = baselines.key(spec.id, "ci", "sim", True, {"batch": 8}, spec.starter)
    assert k != baselines.key(spec.id, "ci", "sim", True, {"batch": 9}, spec.starter)
    assert k != baselines.key(spec.id, "ci", "sim", False, {"batch": 8}, spec.starter)
    assert k != baselines.key(spec.id, "ci", "sim", True, {"batch": 8}, spec.starter + "\n# changed\n")
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

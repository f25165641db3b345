"""The grading's torch threads follow the load (vramlab/grader/threads.py), and grade-bench's load
generator leaves no process behind."""
from __future__ import annotations

import os
import time

import pytest

from vramlab.grader import threads


@pytest.fixture
def machine(monkeypatch):
    """A 4-core machine whose run queue holds `state["runnable"]` tasks (this process included)."""
    state = {"runnable": 1}
    monkeypatch.delenv("VRAMLAB_GRADE_CORES", raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr(threads, "_affinity", lambda: 4)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(threads, "_runnable", lambda: state["runnable"])
    monkeypatch.setattr(threads, "SAMPLE_GAP_S", 0.0)
    return state


def test_an_idle_machine_gives_a_grading_all_its_cores(machine):
    assert threads.torch_threads(1) == 4 and threads.torch_threads(2) == 2


def test_busy_cores_are_left_to_their_processes(machine):
    machine["runnable"] = 1 + 3          # busy processes on all cores but one
    assert threads.torch_threads(1) == 1 and threads.torch_threads(2) == 1
    machine["runnable"] = 1 + 2
    assert threads.torch_threads(1) == 2
    machine["runnable"] = 1 + 40         # more work than cores: still one thread
    assert threads.torch_threads(1) == 1


def test_a_fixed_count_is_taken_as_it_is(machine, monkeypatch):
    machine["runnable"] = 1 + 3
    monkeypatch.setenv("VRAMLAB_GRADE_CORES", "2")
    assert threads.usable_cores() == 2 and threads.torch_threads(1) == 2


def test_slurm_cores_per_task(machine, monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "2")
    assert threads.usable_cores() == 2
    machine["runnable"] = 1 + 2          # a 4-core node, 2 others busy: half of it is this job's share
    assert threads.busy_cores() == 1 and threads.torch_threads(1) == 1


def test_one_noisy_sample_does_not_decide(machine, monkeypatch):
    seen = iter([1, 1, 9, 1, 1])
    monkeypatch.setattr(threads, "_runnable", lambda: next(seen))
    assert threads.busy_cores() == 0


def test_off_linux_nothing_is_busy(machine, monkeypatch):
    monkeypatch.setattr(threads, "_runnable", lambda: None)
    assert threads.torch_threads(1) == 4


def test_runnable_reads_the_run_queue():
    n = threads._runnable()
    assert n is None or n >= 1           # this process is running while it reads


@pytest.mark.slow
def test_busy_load_spins_and_cleans_up():
    from vramlab.grader.bench import busy_load

    with busy_load(1) as procs:
        pid = procs[0].pid
        assert procs[0].poll() is None
        with open(f"/proc/{pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] in "RS"
    time.sleep(0.1)
    assert procs[0].poll() is not None

"""No grading can touch another (issue 28): a writer leaves marks everywhere it can in a warm
slot, the reader graded next in the same slot must get the verdict it gets when graded first, and
the host's shared memory is back to its baseline afterwards."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from vramlab.grader import slots
from vramlab.grader.core import grade_file, grade_source

from test_confine import _shmem     # the host's shared memory, as /proc/meminfo counts it

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent / "fixtures" / "cross_grading"


@pytest.mark.skipif(not slots.ENABLED, reason="常驻沙箱只在 Linux 上使用")
def test_reader_after_writer_in_the_same_slot_gets_its_cold_verdict():
    before = _shmem()
    alone = grade_file("ch05-accumulation", HERE / "reader.py", timeout_s=120)
    writer = grade_file("ch05-accumulation", HERE / "writer.py", timeout_s=120)
    after_writer = grade_file("ch05-accumulation", HERE / "reader.py", timeout_s=120)
    assert (alone["score"], alone["category"]) == (after_writer["score"], after_writer["category"]), \
        (alone["reason"], after_writer["reason"])
    assert alone["score"] == 0, alone["reason"]             # the starter's way: fails on its own
    # and finding a mark would change its verdict: the same reader with the mark taken as found passes
    found = (HERE / "reader.py").read_text(encoding="utf-8").replace("if _found():", "if True:")
    assert grade_source("ch05-accumulation", found, timeout_s=120)["passed"]
    assert writer["score"] == 0, writer["reason"]
    slots.close_all()
    slots.end_parked()
    # the writer left 128 MiB in its sandbox's /dev/shm: it must be gone. Other tests running beside
    # this one (xdist) move the host's Shmem for a moment; a leak stays, so take the lowest of a few readings
    left = min(_shmem() - before for _ in range(6) if time.sleep(0.5) is None)
    assert left < 64 * 2 ** 20, f"shared memory left on the host after the gradings: {left / 2 ** 20:.0f} MiB"

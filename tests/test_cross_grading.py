"""No grading can touch another (issue 28): a writer leaves marks everywhere it can in a warm
slot, the reader graded next in the same slot must get the verdict it gets when graded first, and
the host's shared memory is back to its baseline afterwards."""
from __future__ import annotations

from pathlib import Path

import pytest

from vramlab.grader import slots
from vramlab.grader.core import grade_file

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
    assert writer["score"] == 0, writer["reason"]
    slots.close_all()
    slots.end_parked()
    assert _shmem() <= before + 16 * 2 ** 20, "shared memory left on the host after the gradings"

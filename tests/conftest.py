"""Session-wide set-up.

- This test run measures its own trusted starter runs (the baseline cache,
  vramlab/grader/baselines.py) instead of reading ones kept on this machine by earlier runs.
- The fast tier (`make check`: `-m "not slow"` with VRAMLAB_NO_CHILD_PROCESSES=1) may not start a
  process: a test that does fails here and must be marked `slow`.
"""
import os
import subprocess
import tempfile

import pytest

os.environ["VRAMLAB_CACHE_DIR"] = tempfile.mkdtemp(prefix="vramlab-test-cache-")


@pytest.fixture(autouse=True)
def _no_child_processes(monkeypatch):
    if os.environ.get("VRAMLAB_NO_CHILD_PROCESSES") != "1":
        return

    def refuse(*args, **kwargs):
        raise AssertionError("the fast tier starts no process: mark this test @pytest.mark.slow")

    import multiprocessing.util

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)

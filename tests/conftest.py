"""Session-wide set-up.

- This test run measures its own trusted starter runs (the baseline cache,
  vramlab/grader/baselines.py) instead of reading ones kept on this machine by earlier runs.
- The fast tier (`make check`: `-m "not slow"` with VRAMLAB_NO_CHILD_PROCESSES=1) may not start a
  process: from the first fixture on, starting one raises, and the test must be marked `slow`.
"""
import os
import signal
import tempfile

# A suite started as a background job of a script (`make test &`) inherits SIGINT ignored, and an
# ignored signal stays ignored in every child: the Ctrl-C tests would see nothing. Restore it here,
# in the controller and in each xdist worker, so their children get the default too.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# one folder for the whole run: pytest-xdist's workers inherit it from the controller
os.environ.setdefault("VRAMLAB_TEST_RUN_CACHE", tempfile.mkdtemp(prefix="vramlab-test-cache-"))
os.environ["VRAMLAB_CACHE_DIR"] = os.environ["VRAMLAB_TEST_RUN_CACHE"]
# several test processes grade at once (pytest-xdist): each grading gets its share of the cores
# (grader/core.py, usable_cores): torch threads beyond the cores spin and slow every grading
# A fixed count also keeps the thread count, which is in the starter cache's key, from following
# the machine's load (grader/threads.py) between two gradings of one test.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT", "").isdigit():
    os.environ.setdefault("VRAMLAB_GRADE_CORES",
                          str(max(1, len(os.sched_getaffinity(0)) // max(1, int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))))
else:
    os.environ.setdefault("VRAMLAB_GRADE_CORES", str(len(os.sched_getaffinity(0))))
if os.environ.get("VRAMLAB_NO_CHILD_PROCESSES") == "1":
    os.environ["VRAMLAB_WARM_PARK_S"] = "0"     # the fast tier grades nothing, not even in a parked sandbox


def pytest_sessionfinish(session, exitstatus):
    """The controller ends the warm sandboxes this run's processes parked (slots.py)."""
    if hasattr(session.config, "workerinput") or os.environ.get("VRAMLAB_NO_CHILD_PROCESSES") == "1":
        return
    from vramlab.grader import slots

    slots.end_parked()


def pytest_collection_finish(session):      # collection may probe (pandoc, bwrap); tests may not start
    if os.environ.get("VRAMLAB_NO_CHILD_PROCESSES") != "1":
        return
    import multiprocessing.util
    import subprocess

    def refuse(*args, **kwargs):
        raise AssertionError("the fast tier starts no process: mark this test @pytest.mark.slow")

    subprocess.Popen._execute_child = refuse
    multiprocessing.util.spawnv_passfds = refuse
    os.fork = refuse
    os.posix_spawn = refuse


# The longest files first: pytest-xdist (--dist loadfile) hands out files in collection order, so
# starting the two longest (several minutes each) at once leaves short files to fill in at the end
# instead of one long file running alone after everything else.
LONGEST_FIRST = ("test_nbgrader.py", "test_grader.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))     # stable: order within a file kept

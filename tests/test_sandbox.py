"""The grading sandbox (policy.py) and the parent's observer (observer.py): fast, no grading.

The sandbox tests run a few lines of plain Python under bubblewrap and check what it can see and
do. Without bwrap they skip, except in CI (VRAMLAB_REQUIRE_SANDBOX=1), where they fail.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vramlab.grader import observer, policy

ROOT = Path(__file__).resolve().parent.parent
needs_bwrap = pytest.mark.skipif(policy.bwrap_path() is None and not os.environ.get("VRAMLAB_REQUIRE_SANDBOX"),
                                 reason="bubblewrap 不可用（make test 会在有 root 权限时安装）")


def run_inside(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    argv = policy.bwrap_argv(tmp_path, [sys.executable, "-I", "-c", code])
    return subprocess.run(argv, env=policy.sandbox_env(), capture_output=True, text=True, timeout=60)


def test_policy_mounts_no_course_files(tmp_path):
    argv = policy.bwrap_argv(tmp_path, ["true"])
    sources = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind", "--dev-bind")]
    for forbidden in ("solutions", "tests", "nbgrader", "exercises", "docs"):
        assert not any(Path(s) == ROOT / forbidden or (ROOT / forbidden) in Path(s).parents for s in sources), forbidden
    assert str(ROOT) not in sources                              # never the course root itself
    writable = [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"]
    assert all(Path(w) == tmp_path or tmp_path in Path(w).parents for w in writable)
    hidden = policy.PACKAGE_DIR / "exercises"
    assert argv[argv.index(str(hidden)) - 1] == "--tmpfs"          # the specs hold the reference solutions
    assert "--unshare-all" in argv and "--disable-userns" in argv and ["--remount-ro", "/proc"] == \
        argv[argv.index("--proc") + 2: argv.index("--proc") + 4]


def test_env_is_scrubbed(monkeypatch):
    monkeypatch.setenv("VRAMLAB_SECRET", "x")
    env = policy.sandbox_env()
    assert "VRAMLAB_SECRET" not in env and env["HOME"] == policy.SUBMISSION_DIR


@pytest.mark.slow
@needs_bwrap
def test_inside_the_course_is_absent_and_only_the_folder_is_writable(tmp_path):
    code = f"""
import os, socket
root = {str(ROOT)!r}
print("solutions", os.path.exists(root + "/solutions"), "tests", os.path.exists(root + "/tests"))
print("specs", sorted(os.listdir(root + "/vramlab/exercises")))
for target in ("/usr/pwned", root + "/vramlab/pwned", "/proc/self/clear_refs"):
    try:
        open(target, "w").write("5")
        print("WROTE", target)
    except OSError as e:
        print("refused", target, e.errno)
open("/submission/ok.txt", "w").write("ok")
try:
    socket.create_connection(("1.1.1.1", 80), timeout=2)
    print("NETWORK")
except OSError:
    print("no network")
print("pid", os.getpid())
"""
    out = run_inside(tmp_path, code)
    assert out.returncode == 0, out.stderr
    assert "solutions False tests False" in out.stdout and "specs []" in out.stdout
    assert "WROTE" not in out.stdout and "NETWORK" not in out.stdout
    assert (tmp_path / "ok.txt").read_text() == "ok"
    assert "pid 1\n" in out.stdout                                # its own pid namespace


@pytest.mark.slow
@needs_bwrap
def test_descriptor_relative_paths_cannot_escape(tmp_path):
    """dir_fd tricks: whatever the learner opens, the course is not in its mount namespace."""
    code = f"""
import os
fd = os.open("/", os.O_RDONLY)
names = []
for path in ({str(ROOT.relative_to("/"))!r}, "tmp", "root"):
    try:
        names += os.listdir(os.open(path, os.O_RDONLY, dir_fd=fd))
    except OSError as e:
        names.append("err" + str(e.errno))
print(sorted(set(names)))
"""
    out = run_inside(tmp_path, code)
    assert out.returncode == 0, out.stderr
    listed = out.stdout
    for secret in ("solutions", "tests", "nbgrader", "README.md", "vramlab-grade-"):
        assert secret not in listed, listed


def test_observer_flags_memory_the_report_does_not_explain():
    def obs(rss0, hwm, device0=0):
        return observer.RankObservation(device_at_ready=device0, rss_at_ready=rss0, hwm=hwm)
    MiB = observer.MiB
    starter = [obs(500 * MiB, 700 * MiB)]                     # 200 MiB real for a 250 MiB reported peak
    honest = [obs(500 * MiB, 600 * MiB)]                      # 100 MiB real for 150 MiB reported
    cheat = [obs(500 * MiB, 700 * MiB)]                       # the starter's memory, reported as 150 MiB
    excess, allowed = observer.hidden_memory(honest, [150 * MiB], starter, [250 * MiB])
    assert excess == 0 and allowed == observer.TOLERANCE_BYTES
    excess, allowed = observer.hidden_memory(cheat, [150 * MiB], starter, [250 * MiB])
    assert excess == 100 * MiB > allowed
    assert observer.hidden_memory([observer.RankObservation()], [0], starter, [250 * MiB]) is None


@pytest.mark.slow
@needs_bwrap
def test_a_course_under_tmp_is_not_hidden_by_the_private_tmp(tmp_path, monkeypatch):
    """CI clones the course under /tmp: the sandbox's own /tmp must not cover the package."""
    import shutil

    course = tmp_path / "course"
    shutil.copytree(policy.PACKAGE_DIR, course / "vramlab", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(policy, "PACKAGE_DIR", course / "vramlab")
    (tmp_path / "work").mkdir()
    code = (f"import os, sys; sys.path.insert(0, {str(course)!r}); import vramlab.grader.policy as p; "
            f"print(p.__file__, os.listdir({str(course / 'vramlab' / 'exercises')!r}))")
    out = run_inside(tmp_path / "work", code)
    assert out.returncode == 0, out.stderr
    assert str(course / "vramlab") in out.stdout and "[]" in out.stdout

"""Where the grader makes its memory cgroups (cgroup.py), on v1 and on a delegated v2 subtree:
parsed from /proc/self/mountinfo and /proc/self/cgroup, checked on fake trees (no processes)."""
from __future__ import annotations

from vramlab.grader import cgroup

MOUNTINFO = """\
30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/pids rw,nosuid shared:12 - cgroup cgroup rw,pids
32 25 0:28 / /sys/fs/cgroup/unified rw,nosuid shared:13 - cgroup2 cgroup2 rw,nsdelegate
"""
PROC_CGROUP = "8:pids:/\n4:memory:/process_api/abc\n0::/user.slice/grader.scope\n"


def test_mounts_and_own_paths_are_parsed(tmp_path):
    (tmp_path / "mountinfo").write_text(MOUNTINFO)
    (tmp_path / "cgroup").write_text(PROC_CGROUP)
    mounts = cgroup._mounts(str(tmp_path / "mountinfo"))
    assert ("/sys/fs/cgroup/memory", "/", "cgroup", "rw,memory") in mounts
    assert any(t == "cgroup2" for _m, _r, t, _o in mounts)
    own = cgroup._own_paths(str(tmp_path / "cgroup"))
    assert own["memory"] == "/process_api/abc" and own[""] == "/user.slice/grader.scope"
    assert str(cgroup._inside("/sys/fs/cgroup/memory", "/", own["memory"])) == "/sys/fs/cgroup/memory/process_api/abc"
    # a container that sees its own group as the mount's root
    assert str(cgroup._inside("/sys/fs/cgroup/memory", "/process_api/abc", "/process_api/abc")) == "/sys/fs/cgroup/memory"


def test_v1_group_found_where_it_is_writable(tmp_path):
    group = tmp_path / "memory" / "process_api" / "abc"
    group.mkdir(parents=True)
    (group / "memory.max_usage_in_bytes").write_text("0\n")
    found = cgroup._find_v1([(str(tmp_path / "memory"), "/", "cgroup", "rw,memory")], {"memory": "/process_api/abc"})
    assert found == cgroup.Hierarchy(1, group) and found.peak_file == "memory.max_usage_in_bytes"
    assert cgroup._find_v1([(str(tmp_path / "memory"), "/", "cgroup", "rw,cpu")], {"memory": "/x"}) is None


def test_v2_delegated_subtree_moves_the_grader_into_a_leaf(tmp_path, monkeypatch):
    scope = tmp_path / "grader.scope"
    scope.mkdir()
    (scope / "cgroup.controllers").write_text("cpu memory pids\n")
    (scope / "cgroup.subtree_control").write_text("")
    (scope / "cgroup.procs").write_text("4242\n")
    monkeypatch.setenv("VRAMLAB_CGROUP", str(scope))
    found = cgroup._find_v2([], {})
    assert found == cgroup.Hierarchy(2, scope) and found.peak_file == "memory.peak"
    assert (scope / "grader" / "cgroup.procs").read_text() == "4242"        # the grader left the parent
    assert "memory" in (scope / "cgroup.subtree_control").read_text()


def test_v2_without_the_memory_controller_is_not_used(tmp_path, monkeypatch):
    scope = tmp_path / "scope"
    scope.mkdir()
    (scope / "cgroup.controllers").write_text("cpu pids\n")
    monkeypatch.setenv("VRAMLAB_CGROUP", str(scope))
    assert cgroup._find_v2([], {}) is None


def test_off_and_optional(monkeypatch):
    monkeypatch.setenv("VRAMLAB_CGROUP", "off")
    cgroup.reset_detection()
    try:
        assert cgroup.available() is None and "VRAMLAB_CGROUP=off" in cgroup.why_not()
        assert cgroup.optional()
    finally:
        monkeypatch.delenv("VRAMLAB_CGROUP")
        cgroup.reset_detection()

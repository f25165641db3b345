"""One build of the course site per test run, online and offline, shared by every test file and
every pytest-xdist process: the first to ask builds it under a file lock, the others wait for it
and reuse it (a build is ~20 s on 2 cores; three files used to build both versions each). Tests
only read the builds."""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT_S = 600         # catches a hang; build speed is measured, not asserted (README)


def node_or_skip(what: str) -> str:
    """Path of `node`, which runs the site's own JavaScript outside a browser. Without it the test
    skips, except where the run must not skip (CI, VRAMLAB_REQUIRE_SANDBOX=1): there it fails."""
    import pytest

    node = shutil.which("node")
    if node is None:
        if os.environ.get("VRAMLAB_REQUIRE_SANDBOX") == "1" or os.environ.get("CI"):
            pytest.fail(f"没有 node：CI 里必须{what}（apt-get install nodejs）")
        pytest.skip(f"没有 node，跳过：{what}（装上 nodejs 后运行；CI 里不会跳过）")
    return node


def build_site(dest: Path, *, offline: bool, cwd: Path = REPO) -> str:
    """`mkdocs build --strict` into `dest`; fails on an error or a printed warning; returns the log."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    env.pop("OFFLINE", None)
    if offline:
        env["OFFLINE"] = "true"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(dest)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    assert not re.search(r"^WARNING", log, re.M), f"build printed warnings:\n{log}"
    return log


def shared_build(offline: bool) -> Path:
    """This run's build of the repository's site (built now if no process has built it yet)."""
    root = Path(os.environ["VRAMLAB_TEST_RUN_CACHE"]) / "site-builds"
    root.mkdir(parents=True, exist_ok=True)
    dest = root / ("site-offline" if offline else "site")
    with open(root / f"{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / f"{dest.name}.done").exists():
            shutil.rmtree(dest, ignore_errors=True)
            build_site(dest, offline=offline)
            (root / f"{dest.name}.done").touch()
    return dest

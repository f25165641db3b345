"""Autograde's kernel in the grading sandbox (vramlab/grader/kernel.py): the kernelspec, the launcher's
command line, the sweep of the folder afterwards, and a real sandboxed kernel started with
jupyter_client that tries to reach the course. Fast: no grading. Without bwrap the kernel tests
skip, except in CI (VRAMLAB_REQUIRE_SANDBOX=1), where they fail.
"""
from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import nbformat
import pytest

from vramlab.grader import kernel, policy

ROOT = Path(__file__).resolve().parent.parent
needs_bwrap = pytest.mark.skipif(policy.bwrap_path() is None and not os.environ.get("VRAMLAB_REQUIRE_SANDBOX"),
                                 reason="bubblewrap 不可用（make test 会在有 root 权限时安装）")


def test_kernelspec_is_written_once_and_runs_the_launcher(tmp_path):
    path = kernel.install_kernelspec(tmp_path)
    assert path == tmp_path / "share" / "jupyter" / "kernels" / "vramlab-sandbox" / "kernel.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    assert spec["argv"] == [sys.executable, "-m", "vramlab.grader.kernel", "-f", "{connection_file}"]
    assert spec["display_name"] == "Python 3（vramlab 评分沙箱）" and spec["language"] == "python"
    assert spec["interrupt_mode"] == "message"        # a signal to the launcher would not reach the kernel
    mtime = path.stat().st_mtime_ns
    kernel.install_kernelspec(tmp_path)
    assert path.stat().st_mtime_ns == mtime           # unchanged: not rewritten


def test_autograde_uses_the_sandboxed_kernel_whatever_the_notebook_says():
    ex = kernel.SandboxedExecute()
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    ex.nb = nb
    ex.create_kernel_manager()
    assert ex.km.kernel_name == "vramlab-sandbox"
    # and the course config puts it in autograde (only there: validate keeps nbgrader's own Execute)
    from traitlets.config import Config, PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert isinstance(config, Config)
    pps = config.Autograde.autograde_preprocessors
    assert pps[0] is kernel.SandboxedExecute and "nbgrader.preprocessors.Execute" not in pps
    assert config.SandboxedExecute.require_sandbox is True
    assert kernel.SandboxedExecute(config=config).timeout == config.Execute.timeout    # Execute's settings apply


def test_launcher_command_line(tmp_path):
    argv = kernel.sandbox_argv(tmp_path, 7, ["--Session.key=x"])
    sep = argv.index("--")
    opts, command = argv[:sep], argv[sep + 1:]
    assert command[:5] == [sys.executable, "-m", "ipykernel_launcher", "-f", kernel.CONNECTION_INSIDE]
    assert command[-1] == "--Session.key=x"
    assert "--share-net" in opts and "--unshare-user" in opts and "--disable-userns" in opts
    assert ["--remount-ro", "/proc"] == opts[opts.index("--proc") + 2:opts.index("--proc") + 4]
    assert opts[1:4] == ["--file", "7", kernel.CONNECTION_INSIDE]     # before anything is mounted read-only
    assert "/" in [opts[i + 1] for i, a in enumerate(opts) if a == "--remount-ro"]   # the sandbox's own root
    specs = str(policy.PACKAGE_DIR / "exercises")      # check() in the kernel needs the specs: bound over the tmpfs
    assert max(i for i, a in enumerate(opts) if a == "--ro-bind" and opts[i + 2] == specs) > opts.index(specs)
    writable = [opts[i + 1] for i, a in enumerate(opts) if a == "--bind"]
    assert all(Path(w) == tmp_path or tmp_path in Path(w).parents for w in writable)
    sources = [opts[i + 1] for i, a in enumerate(opts) if a in ("--bind", "--ro-bind", "--dev-bind")]
    for forbidden in ("solutions", "tests", "nbgrader", "docs"):
        assert not any(Path(s) == ROOT / forbidden or (ROOT / forbidden) in Path(s).parents for s in sources)
    assert str(ROOT) not in sources


def test_without_bwrap_the_launcher_warns_or_refuses(monkeypatch, capsys):
    monkeypatch.setattr(policy, "bwrap_path", lambda: None)
    ran = []
    monkeypatch.setattr(os, "execv", lambda exe, args: ran.append(args))
    monkeypatch.setenv(kernel.REQUIRE_ENV, "require")              # autograde
    with pytest.raises(SystemExit) as e:
        kernel.main(["-f", "/x/kernel.json"])
    assert e.value.code == 3 and not ran
    assert "拒绝启动自动评分 kernel" in capsys.readouterr().err
    monkeypatch.delenv(kernel.REQUIRE_ENV)                         # a learner who picked this kernel
    kernel.main(["-f", "/x/kernel.json", "--Session.key=x"])
    assert ran == [[sys.executable, "-m", "ipykernel_launcher", "-f", "/x/kernel.json",
                    "--HistoryManager.hist_file=:memory:", "--Session.key=x"]]
    assert policy.NO_SANDBOX_WARNING in capsys.readouterr().err


def test_sweep_removes_links_and_special_files(tmp_path):
    outside = tmp_path / "gradebook.db"
    outside.write_text("db")
    work = tmp_path / "autograded" / "mallory" / "ex"
    (work / "sub").mkdir(parents=True)
    (work / "tmp").mkdir()
    (work / "tmp" / "junk").write_text("x")
    (work / "ex.txt").write_text("kept")
    os.symlink("../../../gradebook.db", work / "ex.ipynb")
    os.symlink(str(tmp_path), work / "sub" / "up")
    os.mkfifo(work / "fifo")
    removed = kernel.sweep(work, ("tmp",))
    assert sorted(removed) == ["ex.ipynb", "fifo", os.path.join("sub", "up")]
    assert sorted(os.listdir(work)) == ["ex.txt", "sub"] and os.listdir(work / "sub") == []
    assert outside.read_text() == "db"


# ---------------------------------------------------------------------------------------------------
# A real kernel
# ---------------------------------------------------------------------------------------------------
@pytest.fixture
def sandboxed_kernel(tmp_path):
    """A fake course (gradebook, solutions, another student) and the kernel in one student's folder."""
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    course = tmp_path / "course"
    work = course / "nbgrader" / "autograded" / "alice" / "ex"
    work.mkdir(parents=True)
    (course / "nbgrader" / "gradebook.db").write_text("db")
    (course / "solutions" / "ex").mkdir(parents=True)
    (course / "solutions" / "ex" / "ex.ipynb").write_text("answer")
    (course / "nbgrader" / "submitted" / "bob" / "ex").mkdir(parents=True)
    (course / "nbgrader" / "submitted" / "bob" / "ex" / "ex.ipynb").write_text("bob")
    kernel.install_kernelspec(tmp_path / "prefix")
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "prefix" / "share" / "jupyter" / "kernels")])
    km = KernelManager(kernel_name=kernel.KERNEL_NAME, kernel_spec_manager=ksm)
    km.start_kernel(cwd=str(work), env=dict(os.environ, **{kernel.REQUIRE_ENV: "require"}))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        yield course, work, km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def run(kc, code: str, timeout: float = 60) -> tuple[str, dict]:
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return "".join(out), reply["content"]


@pytest.mark.slow
@needs_bwrap
def test_sandboxed_kernel_sees_and_writes_only_its_folder(sandboxed_kernel):
    course, work, _, kc = sandboxed_kernel
    repo_probe = ROOT / "nbgrader" / f"kernel-probe-{uuid.uuid4().hex}"
    code = f"""
import json, os
course, repo = {str(course)!r}, {str(ROOT)!r}
seen = {{"cwd": os.getcwd(), "root": sorted(os.listdir("/")), "up": sorted(os.listdir("../../.."))}}
seen["exists"] = [p for p in (course, course + "/solutions/ex/ex.ipynb", "../../../submitted/bob/ex/ex.ipynb",
                              repo + "/solutions", repo + "/tests", repo + "/nbgrader_config.py") if os.path.exists(p)]
seen["wrote"] = []
for p in (course + "/nbgrader/gradebook.db", "../../../gradebook.db", "../../../../solutions/ex/ex.ipynb",
          {str(repo_probe)!r}, repo + "/vramlab/pwned.py", "/pwned"):
    try:
        open(p, "w").write("pwned")
        seen["wrote"].append(p)
    except OSError:
        pass
try:        # a hard link to a course file would let nbgrader's writes reach it; across mounts: EXDEV
    os.link(repo + "/vramlab/__init__.py", "linked.py")
    seen["wrote"].append("linked.py")
except OSError:
    pass
open("answer.txt", "w").write("mine")
open("/tmp/scratch.txt", "w").write("scratch")
print(json.dumps(seen))
"""
    try:
        out, reply = run(kc, code)
    finally:
        if repo_probe.exists():
            repo_probe.unlink()
    assert reply["status"] == "ok", out
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["cwd"] == "/submission" and seen["exists"] == [] and seen["wrote"] == [], seen
    assert "nbgrader" not in seen["root"] and "submitted" not in seen["up"] and "gradebook.db" not in seen["up"]
    assert (course / "nbgrader" / "gradebook.db").read_text() == "db"
    assert (course / "solutions" / "ex" / "ex.ipynb").read_text() == "answer"
    assert (work / "answer.txt").read_text() == "mine"                 # the folder is writable
    assert (work / "tmp" / "scratch.txt").read_text() == "scratch"     # /tmp is a folder in it
    assert not (course / "pwned").exists()


@pytest.mark.slow
@needs_bwrap
def test_sandboxed_kernel_can_be_interrupted(sandboxed_kernel):
    """nbgrader interrupts a cell that runs past its timeout: by message, the kernel gets SIGINT."""
    import threading
    import time

    _, _, km, kc = sandboxed_kernel
    timer = threading.Timer(2.0, km.interrupt_kernel)
    timer.start()
    t0 = time.monotonic()
    out, reply = run(kc, "import time\ntime.sleep(60)")
    timer.cancel()
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", out
    assert time.monotonic() - t0 < 50                     # interrupted, not the full 60 s sleep

"""The Jupyter kernel of `nbgrader autograde`, in the grading sandbox.

    python -m vramlab.grader.kernel -f CONNECTION_FILE [ipykernel options]

autograde executes every cell of a submission, not only the function that the grader sandboxes:
in a plain kernel the learner's top-level code could read solutions/ and the other submissions and
rewrite nbgrader/gradebook.db. This launcher runs ipykernel under bubblewrap (policy.py) with the
notebook's own folder (the kernel's cwd, nbgrader/autograded/<student>/<id>/) as /submission: the
only part of the course it can see, and the only place it can write. It keeps the host's network
namespace, since the kernel must reach nbclient's ZeroMQ ports on localhost.

Only autograde uses it: `SandboxedExecute` (nbgrader_config.py) installs the kernelspec
`vramlab-sandbox` and starts it; the notebooks themselves keep `python3`, so `make lab` and
`nbgrader validate` run the ordinary kernel. Without bubblewrap the launcher starts an ordinary
kernel with a warning, except under autograde (VRAMLAB_KERNEL_SANDBOX=require), where it refuses:
nbgrader then records an error for that submission and goes on with the next.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

from . import policy

KERNEL_NAME = "vramlab-sandbox"
DISPLAY_NAME = "Python 3（vramlab 评分沙箱）"
REQUIRE_ENV = "VRAMLAB_KERNEL_SANDBOX"           # "require": no bubblewrap -> no kernel
INSIDE_ENV = "VRAMLAB_IN_KERNEL_SANDBOX"        # set in the kernel's environment
DEFER_ENV = "VRAMLAB_DEFER_CHECK"               # set by autograde.TrustedRegrade: it grades, not the kernel
CONNECTION_INSIDE = "/run/vramlab/kernel.json"
SCRATCH = ("tmp", "shm")                         # made by policy.bwrap_argv in the folder: /tmp, /dev/shm
NO_SANDBOX_KERNEL_REFUSAL = (
    "没有可用的 bubblewrap（bwrap）沙箱，拒绝启动自动评分 kernel：学员 notebook 的每个单元格都必须在"
    "操作系统沙箱里运行，否则它能读到 solutions/ 和其他学员的提交、改写成绩库。"
    "请在 Linux 上安装 bubblewrap（sudo apt-get install bubblewrap）；确实要在没有沙箱的情况下评分，"
    "请在 nbgrader_config.py 里设 c.SandboxedExecute.require_sandbox = False（只在信任提交者时这样做）")


def kernelspec() -> dict:
    # "message": interrupts go over the control channel; a signal to our process group would not
    # reach the kernel, which bwrap --new-session puts in a session of its own
    return {"argv": [sys.executable, "-m", "vramlab.grader.kernel", "-f", "{connection_file}"],
            "display_name": DISPLAY_NAME, "language": "python", "interrupt_mode": "message",
            "metadata": {"debugger": False}}


def install_kernelspec(prefix: str | os.PathLike | None = None) -> Path:
    """Write <prefix>/share/jupyter/kernels/vramlab-sandbox/kernel.json (prefix: this venv, where
    jupyter_client looks without root); rewritten only when it differs (the venv moved)."""
    path = Path(prefix or sys.prefix) / "share" / "jupyter" / "kernels" / KERNEL_NAME / "kernel.json"
    text = json.dumps(kernelspec(), ensure_ascii=False, indent=1) + "\n"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path


def kernel_env() -> dict[str, str]:
    """The sandbox's environment, with the runtime folders of Jupyter, IPython, matplotlib and torch
    in the private /tmp (the folder's tmp/, removed after the run): nothing lands next to the notebook."""
    env = policy.sandbox_env()
    env.update(JUPYTER_RUNTIME_DIR="/tmp/jupyter", IPYTHONDIR="/tmp/ipython", MPLCONFIGDIR="/tmp/matplotlib",
               XDG_CACHE_HOME="/tmp/.cache", TORCHINDUCTOR_CACHE_DIR="/tmp/.inductor")
    env["JPY_PARENT_PID"] = "1"      # ipykernel: no parent to poll (bwrap --die-with-parent), no stdout banner
    # for messages only (the learner can set it too): vramlab.check() in here runs without bwrap of its
    # own, since a sandbox cannot nest, but the machine is not unsandboxed
    env[INSIDE_ENV] = "1"
    if "NBGRADER_EXECUTION" in os.environ:       # nbgrader tells the notebook it is being autograded
        env["NBGRADER_EXECUTION"] = os.environ["NBGRADER_EXECUTION"]
    if os.environ.get(DEFER_ENV) == "1":          # only when TrustedRegrade is configured to grade
        env[DEFER_ENV] = "1"
    return env


def ipykernel_command(connection: str, kernel_args: list[str]) -> list[str]:
    # no history database: nbclient asks for that only for kernels named python3
    return [sys.executable, "-m", "ipykernel_launcher", "-f", connection, "--HistoryManager.hist_file=:memory:",
            *kernel_args]


def sandbox_argv(workdir: str | os.PathLike, connection_fd: int, kernel_args: list[str]) -> list[str]:
    """bwrap's command line for ipykernel in `workdir`; the connection file comes in on an fd."""
    command = ipykernel_command(CONNECTION_INSIDE, kernel_args)
    # vramlab.check() in the kernel grades from the exercise specs: keep them visible (the learner
    # has them in the installed package anyway); the reference *notebooks*, solutions/, stay absent
    specs = str(policy.PACKAGE_DIR / "exercises")
    argv = policy.bwrap_argv(workdir, command, network=True, extra_binds=(specs,))
    # the connection file is copied in (bwrap --file, first, before the root goes read-only), not
    # bound at its own path: the runtime folder may be under /tmp, which the sandbox's own /tmp
    # covers, and its path names the host
    return argv[:1] + ["--file", str(connection_fd), CONNECTION_INSIDE] + argv[1:]


def _split_args(argv: list[str]) -> tuple[str, list[str]]:
    args = list(argv)
    for i, a in enumerate(args):
        if a == "-f" and i + 1 < len(args):
            return args[i + 1], args[:i] + args[i + 2:]
    raise SystemExit("用法：python -m vramlab.grader.kernel -f CONNECTION_FILE")


def main(argv: list[str]) -> None:
    connection, rest = _split_args(argv)
    if policy.bwrap_path() is None:
        if os.environ.get(REQUIRE_ENV) == "require":
            print(NO_SANDBOX_KERNEL_REFUSAL, file=sys.stderr, flush=True)
            raise SystemExit(3)
        print(policy.NO_SANDBOX_WARNING, file=sys.stderr, flush=True)
        return os.execv(sys.executable, ipykernel_command(connection, rest))
    fd = os.open(connection, os.O_RDONLY)
    os.set_inheritable(fd, True)
    argv = sandbox_argv(os.getcwd(), fd, rest)
    os.execve(argv[0], argv, kernel_env())     # bwrap is now the kernel process jupyter_client manages


# ---------------------------------------------------------------------------------------------------
# nbgrader side (imported by the nbgrader process only)
# ---------------------------------------------------------------------------------------------------
def sweep(workdir: str | os.PathLike, scratch: tuple[str, ...] = ()) -> list[str]:
    """After the kernel is gone: remove every symlink, FIFO or socket the learner left in its folder.
    nbgrader then writes the executed notebook there, and generate_feedback copies the folder's
    files, both following links: `x.ipynb -> ../../../gradebook.db` would reach the course.
    `scratch` folders (the sandbox's /tmp and /dev/shm, made for this run) go as a whole."""
    removed = []
    for name in scratch:
        p = os.path.join(workdir, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)            # never follows links
    for top, dirs, files in os.walk(workdir):               # does not descend into linked folders
        for name in dirs + files:
            p = os.path.join(top, name)
            try:
                mode = os.lstat(p).st_mode
            except FileNotFoundError:
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                os.unlink(p)
                removed.append(os.path.relpath(p, workdir))
    return removed


def _make_execute():
    from nbgrader.preprocessors import Execute
    from traitlets import Bool, Unicode

    class SandboxedExecute(Execute):
        """nbgrader's Execute with the sandboxed kernel, whatever kernelspec the notebook names."""

        kernel_name = Unicode(KERNEL_NAME, help="autograde 使用的 kernel").tag(config=True)
        require_sandbox = Bool(True, help="没有 bubblewrap 时拒绝评分（每份提交记一条错误）").tag(config=True)

        def preprocess(self, nb, resources=None, km=None):
            # the kernel's cwd becomes its writable /submission: it must be the notebook's own folder,
            # never nbgrader's cwd (the course root), which nbclient would use without a path
            workdir = (resources or {}).get("metadata", {}).get("path")
            if not workdir:
                raise ValueError("不知道这份 notebook 所在的文件夹，不能在沙箱里执行它")
            if self.kernel_name == KERNEL_NAME:
                install_kernelspec()
            fresh = [s for s in SCRATCH if not os.path.lexists(os.path.join(workdir, s))]
            previous = os.environ.get(REQUIRE_ENV)
            os.environ[REQUIRE_ENV] = "require" if self.require_sandbox else "auto"   # the kernel inherits it
            try:
                return super().preprocess(nb, resources, km)
            finally:
                if previous is None:
                    os.environ.pop(REQUIRE_ENV, None)
                else:
                    os.environ[REQUIRE_ENV] = previous
                removed = sweep(workdir, tuple(fresh))          # the kernel is shut down by now
                if removed:
                    self.log.warning("删除了学员 kernel 留下的链接或特殊文件：%s", ", ".join(removed))

    return SandboxedExecute


def __getattr__(name):          # nbgrader is imported by nbgrader_config.py, never by the launcher
    if name == "SandboxedExecute":
        cls = _make_execute()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

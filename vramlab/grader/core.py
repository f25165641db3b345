"""The trusted parent side of the grader.

`grade_source(exercise_id, source)` runs the exercise's starter (trusted) and the learner's code,
each in its own `python -I` subprocess (vramlab.grader.harness) with resource limits, a fresh
temporary working directory and a scrubbed environment, then compares: peak ratio against the
spec's target, losses and parameter updates against the starter's, a physical lower bound on the
peak, and the guard violations the harness recorded. The result is one JSON-able dict.
"""
from __future__ import annotations

import ast
import hashlib
import hmac
import json
import math
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..units import GiB, MiB, fmt_bytes

PACKAGE_DIR = Path(__file__).resolve().parent.parent          # .../vramlab
GRADER_DIR = PACKAGE_DIR / "grader"
EXERCISES_DIR = PACKAGE_DIR / "exercises"

DEFAULT_TIMEOUT = {"ci": 120, "gpu": 600}
DEFAULT_MEMORY = {"ci": 8 * GiB, "gpu": 48 * GiB}
OUTPUT_LIMIT = 64 * MiB
FORBIDDEN_MODULES = ("vramlab.exercises", "vramlab.grader", "vramlab.notebook_check")
LR = 1e-3
_BASELINE_CACHE: dict = {}

# What the learner reads. `category` is a stable English key (tests, JSON); `reason` is Chinese.
CATEGORY_ZH = {
    "ok": "通过",
    "too_much_memory": "峰值显存没有降到目标以下",
    "incorrect": "结果与起始代码不一致",
    "technique": "没有使用本题要求的方法",
    "slow": "单步耗时超出允许范围",
    "too_many_trials": "试探次数太多",
    "timeout": "运行超时",
    "crashed": "进程异常退出",
    "exit": "代码调用了退出",
    "exception": "代码运行出错",
    "oom": "内存/显存不足",
    "tamper": "干扰了显存计量",
    "forbidden": "执行了评分沙箱禁止的操作",
    "invalid_submission": "提交的文件无法评分",
}
_VIOLATION_CATEGORY = {
    "reset_peak": "tamper", "empty_cache": "tamper", "untracked": "tamper", "host": "tamper", "tracker_paused": "tamper",
    "dispatch_escape": "tamper", "untracked_grad": "tamper", "tamper": "tamper",
    "skipped_work": "incorrect",
}


class GraderError(RuntimeError):
    """The grader itself could not run (not the learner's fault): the CLI exits non-zero."""


# ---------------------------------------------------------------------------------------------------
# Reading submissions
# ---------------------------------------------------------------------------------------------------
class SubmissionError(Exception):
    def __init__(self, category: str, reason: str):
        super().__init__(reason)
        self.category, self.reason = category, reason


def notebook_source(text: str, function: str) -> str:
    """The code of a notebook that the grader runs: top-level imports, function and class
    definitions and constant assignments of every code cell; calls (e.g. the `check()` test cell),
    magics and shell lines are left out. Cells that do not parse are skipped, unless the graded
    function is in one of them."""
    try:
        nb = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SubmissionError("invalid_submission", f"notebook 文件不是合法的 JSON，无法读取（{e.msg if hasattr(e, 'msg') else e}）："
                              "请在 Jupyter 里重新保存，或从 exercises/ 重新复制一份") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise SubmissionError("invalid_submission", "notebook 文件缺少 cells 字段，不是 Jupyter notebook")
    parts: list[str] = []
    syntax_error = None
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        lines = [("# " + ln) if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines()]
        src = "\n".join(lines)
        try:
            tree = ast.parse(src)
        except SyntaxError as e:
            if f"def {function}" in src:
                syntax_error = e
            continue
        for node in tree.body:
            keep = isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                keep = isinstance(getattr(node, "value", None), ast.Constant)
            if keep:
                parts.append(ast.get_source_segment(src, node) or "")
    if syntax_error is not None and not any(p.startswith((f"def {function}", f"async def {function}")) for p in parts):
        raise SubmissionError("invalid_submission", f"定义 {function} 的代码单元有语法错误：第 {syntax_error.lineno} 行 "
                              f"{syntax_error.msg}")
    return "\n\n".join(parts) + "\n"


def check_source(source: str, function: str) -> None:
    """Static checks before anything runs: parses, defines the function, imports nothing internal."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise SubmissionError("invalid_submission", f"代码有语法错误：第 {e.lineno} 行 {e.msg}") from None
    defined = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function for n in tree.body)
    if not defined:
        raise SubmissionError("invalid_submission", f"没有找到函数 `{function}`：请保留题目给出的函数名和参数")
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.startswith(FORBIDDEN_MODULES):
                raise SubmissionError("forbidden", f"提交的代码导入了评分器内部模块 `{name}`：不允许读取参考答案或评分代码")


def read_submission(path: str | os.PathLike, function: str) -> str:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise SubmissionError("invalid_submission", f"无法读取提交的文件 {p}：{e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SubmissionError("invalid_submission", "提交的文件不是 UTF-8 文本") from None
    if p.suffix == ".ipynb":
        return notebook_source(text, function)
    return text


# ---------------------------------------------------------------------------------------------------
# Running one harness child
# ---------------------------------------------------------------------------------------------------
@dataclass
class ChildRun:
    payload: dict | None
    returncode: int | None
    timed_out: bool
    seconds: float
    stderr_tail: str
    forged: bool = False


def _course_roots() -> tuple[list[str], list[str], list[str]]:
    """(forbidden, protected, allowed) read roots for the child."""
    root = PACKAGE_DIR.parent
    forbidden = [str(EXERCISES_DIR), str(GRADER_DIR), str(PACKAGE_DIR / "notebook_check.py")]
    protected: list[str] = []
    allowed = [str(PACKAGE_DIR), sys.prefix, sys.base_prefix]
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            allowed.append(path)
    if (root / "pyproject.toml").exists() or (root / "solutions").exists():
        protected.append(str(root))
        forbidden += [str(root / "solutions"), str(root / "tests"), str(root / "source"),
                      str(root / "release"), str(root / "autograded"), str(root / "submitted")]
    extra = os.environ.get("VRAMLAB_PROTECTED_DIRS", "")
    forbidden += [d for d in extra.split(os.pathsep) if d]
    return forbidden, protected, allowed


def _limits(memory: int, cpu_seconds: int):
    def apply():
        os.setsid()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_LIMIT, OUTPUT_LIMIT))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        try:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        except (ValueError, OSError):
            pass
        try:  # threads count too: leave room for torch's pools (not enforced for root)
            resource.setrlimit(resource.RLIMIT_NPROC, (_NPROC, _NPROC))
        except (ValueError, OSError):
            pass
    return apply


def _count_tasks() -> int:
    try:
        uid = os.getuid()
        n = 0
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    if os.stat(f"/proc/{pid}").st_uid == uid:
                        n += len(os.listdir(f"/proc/{pid}/task"))
                except OSError:
                    pass
        return n
    except OSError:
        return 256


_NPROC = 0


def run_child(job: dict, source: str, timeout_s: float, memory_limit: int, keep_dir: bool = False,
              stop: threading.Event | None = None) -> ChildRun:
    global _NPROC
    _NPROC = _count_tasks() + 128
    outer = Path(tempfile.mkdtemp(prefix="vramlab-grade-"))
    workdir = outer / "work"
    workdir.mkdir()
    (workdir / "submission.py").write_text(source, encoding="utf-8")
    forbidden, protected, allowed = _course_roots()
    job = dict(job, source_file=str(workdir / "submission.py"), workdir=str(workdir),
               result=str(outer / "result.json"), protected_read=protected, forbidden_read=forbidden,
               allowed_read=allowed)
    (outer / "job.json").write_text(json.dumps(job), encoding="utf-8")
    key = secrets.token_bytes(32)
    r, w = os.pipe()
    os.write(w, key)
    os.close(w)
    env = {
        "PATH": "/usr/bin:/bin", "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
        "XDG_CACHE_HOME": str(workdir / ".cache"), "TORCHINDUCTOR_CACHE_DIR": str(workdir / ".inductor"),
        "PYTHONIOENCODING": "utf-8", "TOKENIZERS_PARALLELISM": "false",
    }
    for k in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"):
        if k in os.environ:
            env[k] = os.environ[k]
    cmd = [sys.executable, "-I", "-B", "-X", "utf8", "-m", "vramlab.grader.harness", str(outer / "job.json"), str(r)]
    stdout = open(outer / "stdout.txt", "wb")
    stderr = open(outer / "stderr.txt", "wb")
    t0 = time.perf_counter()
    timed_out = False
    try:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                pass_fds=(r,), preexec_fn=_limits(memory_limit, int(timeout_s) + 10),
                                close_fds=True)
    finally:
        os.close(r)
        stdout.close()
        stderr.close()
    try:
        deadline = time.monotonic() + timeout_s
        while True:        # poll, so that a sibling rank that failed can stop this one early
            try:
                proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if stop is not None and stop.is_set():
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)       # the whole group: children it may have made
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    seconds = time.perf_counter() - t0
    payload, forged = None, False
    try:
        doc = json.loads((outer / "result.json").read_text(encoding="utf-8"))
        body, mac = doc["payload"], doc["mac"]
        good = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
        if hmac.compare_digest(good, mac):
            payload = json.loads(body)
        else:
            forged = True
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError):
        forged = True
    try:
        with open(outer / "stderr.txt", "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 4000))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        tail = ""
    if not keep_dir:
        shutil.rmtree(outer, ignore_errors=True)
    return ChildRun(payload, proc.returncode, timed_out, seconds, tail, forged)


# ---------------------------------------------------------------------------------------------------
# Grading
# ---------------------------------------------------------------------------------------------------
def _job(spec, scale_name: str, backend: str) -> dict:
    scale = getattr(spec, scale_name)
    return {
        "function": spec.function, "model": scale.model, "config": dict(scale.extra.get("config", {})),
        "batch": scale.batch, "seq": scale.seq, "steps": scale.steps, "warmup": scale.warmup, "seed": 0,
        "lr": scale.extra.get("lr", LR), "backend": backend, "threads": 1, "features_k": 2,
        "kind": spec.kind, "extra": {k: v for k, v in scale.extra.items() if k != "config"},
        # hidden cases that change with every grading (ch02): a number copied from feedback is useless
        "case_seed": secrets.randbelow(2 ** 31) if spec.kind == "monitor" else 0,
        "world_size": int(scale.extra.get("world_size", 1)),
    }


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(job: dict, source: str, timeout_s: float, memory_limit: int) -> list[ChildRun]:
    """One child per rank (world_size > 1): they meet over gloo on a local port. When one rank
    ends without a good result the others are stopped instead of waiting for a collective."""
    world = int(job.get("world_size", 1))
    if world == 1:
        return [run_child(job, source, timeout_s, memory_limit)]
    init = f"tcp://127.0.0.1:{_free_port()}"
    stop = threading.Event()
    runs: list[ChildRun | None] = [None] * world

    def go(rank: int):
        r = run_child(dict(job, rank=rank, init_method=init, dist_timeout=timeout_s), source, timeout_s,
                      memory_limit, stop=stop)
        runs[rank] = r
        if r.payload is None or not r.payload.get("ok") or r.payload.get("violations"):
            stop.set()
    threads = [threading.Thread(target=go, args=(rank,)) for rank in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return runs


def merge_ranks(runs: list[ChildRun]) -> ChildRun:
    """The ranks as one result: the first failure if any rank failed; otherwise rank 0's payload
    with the worst peak of all ranks, and per-rank losses, updates and outputs side by side (so
    every rank is compared with the same rank of the trusted run)."""
    if len(runs) == 1:
        return runs[0]
    failed = [(r.seconds, rank, r) for rank, r in enumerate(runs)
              if r.timed_out or r.forged or r.payload is None or not r.payload.get("ok") or r.payload.get("violations")]
    if failed:     # the rank that failed first is the cause; the others saw its connection close
        _, rank, r = min(failed, key=lambda f: (f[0], f[1]))
        p = r.payload
        if p is not None and p.get("error"):
            p = dict(p, error=dict(p["error"], message=f"rank {rank}：{p['error'].get('message', '')}"))
        return ChildRun(p, r.returncode, r.timed_out, r.seconds, r.stderr_tail, r.forged)
    payloads = [r.payload for r in runs]
    merged = dict(payloads[0])
    peaks = [int(p.get("peak_bytes") or 0) for p in payloads]
    merged["peak_bytes"] = max(peaks)
    merged["rank_peak_bytes"] = peaks
    for key in ("metric_bytes", "reserved_peak_bytes"):
        if key in merged:
            merged[key] = max(int(p[key]) for p in payloads)
    for key in ("losses", "update", "outputs"):
        if key in merged:
            merged[key] = [x for p in payloads for x in p[key]]
    return ChildRun(merged, runs[0].returncode, False, max(r.seconds for r in runs),
                    runs[0].stderr_tail, False)


def _rel(a: list[float], b: list[float]) -> float:
    num = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    den = math.sqrt(sum(y * y for y in b))
    return num / den if den else (0.0 if num == 0 else math.inf)


def update_tolerance(spec) -> float:
    """Relative error allowed between the parameter update of the submission and the starter's."""
    return float(spec.update_rtol)


def _base_result(spec, backend: str, scale: str) -> dict:
    return {
        "exercise": spec.id, "kind": spec.kind, "passed": False, "score": 0, "max_score": spec.points, "category": None,
        "reason": "", "peak_bytes": None, "baseline_peak_bytes": None, "ratio": None,
        "target_ratio": spec.target_ratio, "correct": None, "backend": backend, "scale": scale,
        "time_ratio": None, "step_seconds": None, "baseline_step_seconds": None, "max_time_ratio": spec.max_time_ratio,
        "loss_max_rel_err": None, "update_rel_err": None, "violations": [], "hints": list(spec.hints),
        "seconds": None,
    }


def _fail(result: dict, category: str, reason: str) -> dict:
    result.update(passed=False, score=0, category=category,
                  reason=f"{CATEGORY_ZH.get(category, category)}：{reason}" if reason else CATEGORY_ZH[category])
    return result


def grade_source(exercise_id: str, source: str, backend: str = "sim", scale: str = "ci",
                 timeout_s: float | None = None, memory_limit_bytes: int | None = None,
                 _spec=None, reuse_baseline: bool = False) -> dict:
    """Grade learner code (a Python module defining the exercise's function). Never raises for
    anything the learner did; raises KeyError (unknown exercise) or GraderError (grader broken).

    The starter runs in its own trusted subprocess at the same time as the submission (one torch
    thread each). `reuse_baseline=True` reuses a starter run from earlier in this process (tests,
    batch grading); the default measures it afresh in every call."""
    from ..exercises import get_exercise

    spec = _spec or get_exercise(exercise_id)
    if scale not in ("ci", "gpu"):
        raise GraderError(f"未知规模 {scale!r}：可选 ci、gpu")
    if backend not in ("sim", "cuda"):
        raise GraderError(f"未知后端 {backend!r}：可选 sim、cuda")
    t_start = time.perf_counter()
    result = _base_result(spec, backend, scale)
    try:
        check_source(source, spec.function)
    except SubmissionError as e:
        result["seconds"] = round(time.perf_counter() - t_start, 2)
        return _fail(result, e.category, e.reason)
    timeout = float(timeout_s or DEFAULT_TIMEOUT[scale])
    memory = int(memory_limit_bytes or DEFAULT_MEMORY[scale])
    job = _job(spec, scale, backend)

    runs: dict[str, ChildRun] = {}

    def go(name, src, t):
        runs[name] = merge_ranks(run_ranks(dict(job, reference=name == "baseline"), src, t, memory))

    base_timeout = max(timeout, DEFAULT_TIMEOUT[scale])
    cache_key = (spec.id, scale, backend, hashlib.sha256((spec.starter + json.dumps(job)).encode()).hexdigest())
    if reuse_baseline and cache_key in _BASELINE_CACHE:
        runs["baseline"] = _BASELINE_CACHE[cache_key]
        go("submission", source, timeout)
    else:
        th = threading.Thread(target=go, args=("baseline", spec.starter, base_timeout))
        th.start()
        go("submission", source, timeout)
        th.join()
    base, sub = runs["baseline"], runs["submission"]
    if reuse_baseline and base.payload and base.payload.get("ok"):
        _BASELINE_CACHE[cache_key] = base
    result["seconds"] = round(time.perf_counter() - t_start, 2)
    bp = base.payload
    if bp is None or not bp.get("ok"):
        detail = (bp or {}).get("error") or base.stderr_tail[-800:]
        raise GraderError(f"起始代码（可信基线）没能运行，评分器本身有问题：{detail}")
    if bp.get("violations"):
        raise GraderError(f"起始代码（可信基线）触发了评分器的防护，评分器本身有问题：{bp['violations'][:3]}")
    result["baseline_peak_bytes"] = bp.get("peak_bytes")
    result["baseline_step_seconds"] = bp.get("step_seconds")
    failed = _child_failed(result, sub, timeout)
    return failed or JUDGES[spec.kind](spec, result, bp, sub.payload)


def _child_failed(result: dict, sub: ChildRun, timeout: float) -> dict | None:
    """What every kind judges first: the child ran, signed its result, and broke no rule."""
    if sub.timed_out:
        return _fail(result, "timeout", f"超过 {timeout:.0f} 秒仍未结束（死循环？或者每一步太慢）。进程已被终止")
    if sub.forged:
        return _fail(result, "tamper", "评分结果文件的签名不对：结果被伪造或改写")
    sp = sub.payload
    if sp is None:
        rc = sub.returncode
        why = {-signal.SIGXCPU: "CPU 时间超限", -signal.SIGXFSZ: "输出或写入的文件过大",
               -signal.SIGKILL: "被强制终止（可能内存不足）", -signal.SIGSEGV: "段错误"}.get(rc, f"退出码 {rc}")
        tail = sub.stderr_tail.strip().splitlines()[-3:]
        if "MemoryError" in sub.stderr_tail or "std::bad_alloc" in sub.stderr_tail:
            return _fail(result, "oom", "进程内存不足被终止")
        return _fail(result, "crashed", f"评分进程在给出结果之前就结束了（{why}）。是不是调用了 os._exit() "
                                        f"或 os.abort()？" + (f" 最后的输出：{' | '.join(tail)}" if tail else ""))
    violations = sp.get("violations") or []
    result["violations"] = [{"category": c, "detail": d} for c, d in violations]
    err = sp.get("error")
    if violations:
        cats = [_VIOLATION_CATEGORY.get(c, "forbidden") for c, _ in violations]
        cat = "tamper" if "tamper" in cats else ("forbidden" if "forbidden" in cats else cats[0])
        details = "；".join(dict.fromkeys(d for _, d in violations))
        return _fail(result, cat, details)
    if err:
        kind = err.get("kind")
        cat = {"exit": "exit", "oom": "oom", "missing_function": "invalid_submission",
               "incorrect": "incorrect"}.get(kind, "exception")
        message = err.get("message", "")
        if cat == "incorrect":      # the harness's own words, not an exception's repr
            message = message.split(": ", 1)[-1] if message.startswith("WrongAnswer: ") else message
        return _fail(result, cat, message)
    return None


def _judge_training(spec, result: dict, bp: dict, sp: dict) -> dict:
    """train_step / train_epoch: peak ratio against the starter, same losses and parameter update."""
    peak, base_peak = int(sp["peak_bytes"]), int(bp["peak_bytes"])
    result.update(peak_bytes=peak, rank_peak_bytes=sp.get("rank_peak_bytes"))
    if getattr(spec, result["scale"]).extra.get("report_savings") and bp.get("breakdown") and sp.get("breakdown"):
        result["savings"] = _savings(bp["breakdown"], sp["breakdown"])      # which technique bought how much
    result["ratio"] = round(peak / base_peak, 4) if base_peak else None
    result["step_seconds"] = sp.get("step_seconds")
    if bp.get("step_seconds"):
        result["time_ratio"] = round(sp["step_seconds"] / bp["step_seconds"], 3)
    # correctness: per-step losses and the parameter update, against the trusted starter
    bl, sl = bp["losses"], sp["losses"]
    loss_err = 0.0
    ok_losses = len(bl) == len(sl) and all(math.isfinite(s) for s in sl)
    if ok_losses:
        for b, s in zip(bl, sl):
            loss_err = max(loss_err, abs(s - b) / max(abs(b), 1e-12))
            if abs(s - b) > spec.atol + spec.rtol * abs(b):
                ok_losses = False
    result["loss_max_rel_err"] = loss_err if ok_losses or len(bl) == len(sl) else None
    upd_err = _rel(sp.get("update") or [], bp.get("update") or [])
    result["update_rel_err"] = upd_err
    ok_update = math.isfinite(upd_err) and upd_err <= update_tolerance(spec) and sp.get("param_count") == bp.get("param_count")
    result["correct"] = bool(ok_losses and ok_update)
    if sp.get("param_count") != bp.get("param_count"):
        return _fail(result, "incorrect", "模型的参数个数变了：不要替换或删减模型")
    if not ok_losses:
        return _fail(result, "incorrect",
                     f"返回的损失与起始代码不同（起始代码 {['%.5f' % x for x in bl]}，你的 {['%.5f' % x for x in sl]}，"
                     f"允许误差 rtol={spec.rtol:g}）。是不是损失没有按 micro-batch 缩放、返回了旧的/缓存的值，"
                     f"或者跳过了某些计算？")
    if not ok_update:
        return _fail(result, "incorrect",
                     f"参数更新与起始代码不同（相对误差 {upd_err:.3g}，允许 {update_tolerance(spec):.3g}）："
                     "梯度要与整个 batch 一起算的相同，每一步要调用一次 optimizer.step()")
    why_not = _technique_missing(spec, sp)
    if why_not:
        return _fail(result, "technique", why_not)
    if peak < int(bp.get("static_bytes", 0)):
        return _fail(result, "tamper", f"测得的峰值 {fmt_bytes(peak)} 低于参数+梯度+优化器状态的物理下限 "
                                       f"{fmt_bytes(bp['static_bytes'])}：显存计量被绕过了")
    if base_peak and peak > spec.target_ratio * base_peak:
        return _fail(result, "too_much_memory",
                     f"峰值 {fmt_bytes(peak)} 是起始代码（{fmt_bytes(base_peak)}）的 {peak / base_peak:.2f} 倍，"
                     f"目标是不超过 {spec.target_ratio:.2f} 倍")
    if spec.max_time_ratio and result["time_ratio"] and result["time_ratio"] > spec.max_time_ratio:
        return _fail(result, "slow", f"单步耗时是起始代码的 {result['time_ratio']:.2f} 倍，允许 {spec.max_time_ratio:.2f} 倍")
    result.update(passed=True, score=spec.points, category="ok",
                  reason=f"通过：峰值是起始代码的 {result['ratio']:.2f} 倍（目标 ≤ {spec.target_ratio:.2f}），结果与起始代码一致"
                         + _savings_line(result))
    return result


MEMORY_CATEGORY_ZH = {"parameters": ("参数", "bf16/8-bit 权重"), "gradients": ("梯度", "低精度梯度、在反向中更新并释放"),
               "optimizer_state": ("优化器状态", "8-bit 优化器、卸载到主存"),
               "activations": ("激活值", "激活检查点、混合精度、激活值卸载"),
               "temporaries": ("临时张量", "梯度累积、分块计算"), "cuda_overhead": ("CUDA 开销", "cuBLAS 工作区")}


def _savings(base: dict, mine: dict) -> dict:
    """Bytes saved per memory category at the peak (starter minus submission), largest first."""
    saved = {k: int(base.get(k, 0)) - int(mine.get(k, 0)) for k in MEMORY_CATEGORY_ZH if k in base or k in mine}
    return dict(sorted(saved.items(), key=lambda kv: -kv[1]))


def _savings_line(result: dict) -> str:
    saved = result.get("savings")
    if not saved:
        return ""
    parts = [f"{MEMORY_CATEGORY_ZH[k][0]} {'省下' if v >= 0 else '多用'} {fmt_bytes(abs(v))}（{MEMORY_CATEGORY_ZH[k][1]}）"
             for k, v in saved.items() if abs(v) >= 2 ** 20]
    return ("。峰值时各类显存与起始代码相比（两边的峰值可能出现在一步中的不同时刻，所以某一类可能“多用”）："
            + "；".join(parts)) if parts else ""


def _technique_missing(spec, sp: dict) -> str | None:
    """The exercise asks for one technique; the harness counted model and block forwards."""
    calls = sp.get("calls") or []
    if not spec.technique or not calls:
        return None
    if spec.technique == "accumulation" and any(c["model"] < 2 for c in calls):
        return ("本题要求梯度累积：每次 train_step 里要把 batch 切成至少 2 个 micro-batch，分别调用模型前向"
                f"（测到每步的前向次数 {[c['model'] for c in calls]}）")
    if spec.technique == "autocast" and any(c["autocast"] < 1 for c in calls):
        return "本题要求混合精度：模型前向要在 torch.autocast(device.type, dtype=torch.bfloat16) 里运行"
    if spec.technique == "checkpoint":
        n = sp.get("n_blocks") or 0
        if any(c["blocks"] <= n * max(c["model"], 1) for c in calls):
            return "本题要求激活检查点：反向时要重新计算 Transformer block 的前向（没有检测到重算）"
    return None


def _worst_case(result: dict, answers: list, truths: list, tol: float) -> int:
    """estimate / monitor: the case with the largest relative error. The result's `peak_bytes` is
    the learner's answer there, `baseline_peak_bytes` the measured truth, `ratio` the error."""
    errs = [abs(a - t) / t if t and math.isfinite(a) else math.inf for a, t in zip(answers, truths)]
    if len(answers) != len(truths) or not errs:
        errs = [math.inf]
    i = max(range(len(errs)), key=errs.__getitem__)
    ok = math.isfinite(errs[i])
    result.update(peak_bytes=int(answers[i]) if ok else None, baseline_peak_bytes=int(truths[i]) if truths else None,
                  ratio=round(errs[i], 4) if ok else None, correct=errs[i] <= tol)
    return i


def _passed(spec, result: dict, reason: str) -> dict:
    result.update(passed=True, score=spec.points, category="ok", reason=f"通过：{reason}")
    return result


def _judge_estimate(spec, result: dict, bp: dict, sp: dict) -> dict:
    """ch01: every estimate within target_ratio (relative) of the static bytes the sim measured."""
    cases = sp.get("cases") or []
    i = _worst_case(result, sp.get("answers") or [], bp.get("truths") or [], spec.target_ratio)
    if result["correct"]:
        return _passed(spec, result, f"所有 {len(cases)} 个用例的估算都在实测值的 ±{spec.target_ratio:.0%} 以内"
                                     f"（最大相对误差 {result['ratio']:.2%}）")
    n, opt, prec = cases[i] if i < len(cases) else ("?", "?", "?")
    visible = i < getattr(spec, result["scale"]).extra.get("visible", 0)
    truth = f"，实测 {result['baseline_peak_bytes']:,} 字节" if visible else "（隐藏用例，不公布实测值）"
    err = f"{result['ratio']:.1%}" if result["ratio"] is not None else "无穷大（返回值不是有限的数）"
    return _fail(result, "incorrect", f"n_params={n:,}、optimizer={opt!r}、precision={prec!r}：你的估算 "
                                      f"{result['peak_bytes'] or 0:,} 字节{truth}，相对误差 {err}，允许 {spec.target_ratio:.0%}")


def _judge_monitor(spec, result: dict, bp: dict, sp: dict) -> dict:
    """ch02: the learner's peak of every hidden function within target_ratio of the harness's own."""
    answers, trusted = sp.get("answers") or [], bp.get("answers") or []
    truths = [a["truth"] for a in answers]
    if any(t < 0.99 * b["truth"] for t, b in zip(truths, trusted)):
        return _fail(result, "tamper", "评分器测得的峰值低于可信进程里同一个函数的峰值：显存计量被绕过了")
    i = _worst_case(result, [a["got"] for a in answers], truths, spec.target_ratio)
    if result["correct"]:
        return _passed(spec, result, f"{len(answers)} 个隐藏函数的峰值都测准了（最大相对误差 {result['ratio']:.2%}）")
    name = answers[i]["case"] if answers else "?"
    return _fail(result, "incorrect", f"隐藏函数 {name}：你返回 {fmt_bytes(result['peak_bytes'] or 0)}，"
                                      f"它运行期间的峰值是 {fmt_bytes(result['baseline_peak_bytes'] or 0)}，"
                                      f"允许误差 {spec.target_ratio:.0%}。先 reset_peak()，再调用 fn()，最后读 max_allocated()")


def _judge_load(spec, result: dict, bp: dict, sp: dict) -> dict:
    """ch03: a bf16 model equal to the starter's, built with a low peak: at most
    `max_model_multiple` x the model's own bytes and target_ratio x the starter's peak."""
    peak, base_peak, model_bytes = int(sp["peak_bytes"]), int(bp["peak_bytes"]), int(bp["model_bytes"])
    err = _rel(sp.get("fingerprint") or [], bp.get("fingerprint") or [])
    result.update(peak_bytes=peak, ratio=round(peak / base_peak, 4) if base_peak else None, update_rel_err=err)
    problems = [
        (sp.get("dtypes") != ["torch.bfloat16"], f"参数的 dtype 是 {sp.get('dtypes')}，要求全部是 torch.bfloat16"),
        (not sp.get("on_device"), "有参数不在设备上（显存里）：模型要直接建在 device.torch_device 上"),
        (sp.get("param_count") != bp.get("param_count"), "参数个数与起始代码的模型不同：用同一个预设"),
        (not err <= spec.rtol, f"参数值与起始代码的模型不同（相对误差 {err:.3g}，允许 {spec.rtol:g}）：用同样的预设和随机种子"),
    ]
    why = [msg for bad, msg in problems if bad]
    result["correct"] = not why
    if why:
        return _fail(result, "incorrect", why[0])
    if peak < model_bytes:
        return _fail(result, "tamper", f"测得的峰值 {fmt_bytes(peak)} 低于模型本身的大小 {fmt_bytes(model_bytes)}：显存计量被绕过了")
    multiple = getattr(spec, result["scale"]).extra.get("max_model_multiple", math.inf)
    if peak > multiple * model_bytes or peak > spec.target_ratio * base_peak:
        return _fail(result, "too_much_memory", f"加载时的峰值 {fmt_bytes(peak)} 是最终 bf16 模型（{fmt_bytes(model_bytes)}）的 "
                                                f"{peak / model_bytes:.2f} 倍、起始代码（{fmt_bytes(base_peak)}）的 {peak / base_peak:.2f} 倍；"
                                                f"目标：不超过模型的 {multiple:.2f} 倍，且不超过起始代码的 {spec.target_ratio:.2f} 倍")
    return _passed(spec, result, f"峰值是 bf16 模型本身的 {peak / model_bytes:.2f} 倍（起始代码的 {result['ratio']:.2f} 倍），"
                                 "参数与起始代码一致")


def _judge_call(spec, result: dict, bp: dict, sp: dict) -> dict:
    """kind "call": the same result as the starter (every output tensor, every rank) and a memory
    metric (the peak, or reserved minus allocated) at most target_ratio x the starter's."""
    metric, base_metric = int(sp["metric_bytes"]), int(bp["metric_bytes"])
    result.update(peak_bytes=int(sp["peak_bytes"]), ratio=round(metric / base_metric, 4) if base_metric else None,
                  metric=spec.metric, metric_bytes=metric, baseline_metric_bytes=base_metric,
                  rank_peak_bytes=sp.get("rank_peak_bytes"))
    outs, base_outs = sp.get("outputs") or [], bp.get("outputs") or []
    errs = [_rel(a, b) for a, b in zip(outs, base_outs)] if len(outs) == len(base_outs) else [math.inf]
    err = max(errs or [math.inf])
    result["update_rel_err"] = err
    result["correct"] = bool(math.isfinite(err) and err <= spec.rtol)
    what = METRIC_ZH.get(spec.metric, "峰值")
    if not result["correct"]:
        return _fail(result, "incorrect", f"结果与起始代码不同（相对误差 {err:.3g}，允许 {spec.rtol:g}）")
    if int(sp["peak_bytes"]) < int(bp.get("floor_bytes", 0)):
        return _fail(result, "tamper", f"测得的峰值 {fmt_bytes(int(sp['peak_bytes']))} 低于输入和输出本身的大小 "
                                       f"{fmt_bytes(int(bp['floor_bytes']))}：显存计量被绕过了")
    if spec.metric == "reserved_gap" and int(sp.get("reserved_peak_bytes", 0)) > int(bp.get("reserved_peak_bytes", 0)):
        return _fail(result, "too_much_memory", f"已保留峰值 {fmt_bytes(int(sp['reserved_peak_bytes']))} 比起始代码的 "
                                                f"{fmt_bytes(int(bp['reserved_peak_bytes']))} 还高")
    if base_metric and metric > spec.target_ratio * base_metric:
        return _fail(result, "too_much_memory", f"{what} {fmt_bytes(metric)} 是起始代码（{fmt_bytes(base_metric)}）的 "
                                                f"{metric / base_metric:.2f} 倍，目标是不超过 {spec.target_ratio:.2f} 倍")
    ranks = sp.get("rank_peak_bytes")
    per_rank = f"（各 rank 峰值 {'、'.join(fmt_bytes(x) for x in ranks)}）" if ranks else ""
    return _passed(spec, result, f"{what}是起始代码的 {result['ratio']:.2f} 倍（目标 ≤ {spec.target_ratio:.2f}）{per_rank}，"
                                 "结果与起始代码一致")


def max_trials(answer: int) -> int:
    """Trials a doubling-then-bisection search needs for an answer (and a little slack)."""
    return 2 * max(1, math.ceil(math.log2(answer + 1))) + 2


def _judge_max_batch(spec, result: dict, bp: dict, sp: dict) -> dict:
    """ch13: the answer fits and answer + 1 does not (checked by the harness after the learner's
    search), found with at most `max_trials(answer)` calls of try_step."""
    answer, trials = int(sp["answer"]), sp.get("trials") or []
    allowed = max_trials(max(answer, 1))
    result.update(peak_bytes=int(sp.get("peak_bytes") or 0), ratio=round(len(trials) / allowed, 4),
                  correct=bool(sp.get("verified")), answer=answer, trials=len(trials), allowed_trials=allowed)
    tried = "、".join(f"{n}{'✓' if ok else '✗'}" for n, ok in trials[:40])
    if not result["correct"]:
        return _fail(result, "incorrect", f"返回的 batch = {answer} 不是最大能放下的 batch（评分器复查：{answer} "
                                          f"要能放下，{answer + 1} 要放不下）。你试过的 batch：{tried or '无'}")
    if len(trials) > allowed:
        return _fail(result, "too_many_trials", f"调用了 {len(trials)} 次 try_step，最多允许 {allowed} 次"
                                                f"（先翻倍、再二分）。你试过的 batch：{tried}")
    return _passed(spec, result, f"最大 batch = {answer}，用了 {len(trials)} 次试探（允许 {allowed} 次）：{tried}")


def _judge_finetune(spec, result: dict, bp: dict, sp: dict) -> dict:
    """ch24-27: the grader trained what `prepare_model` returned. It must be the required peft method
    with a small trainable share, learn (the loss goes down), start from the same function where the
    method promises it (LoRA/DoRA begin as the identity), and peak at most target_ratio x full fine-tuning."""
    peak, base_peak = int(sp["peak_bytes"]), int(bp["peak_bytes"])
    result.update(peak_bytes=peak, ratio=round(peak / base_peak, 4) if base_peak else None,
                  step_seconds=sp.get("step_seconds"), trainable=sp.get("trainable"), total=sp.get("total"))
    losses, base_losses = sp.get("losses") or [], bp.get("losses") or []
    share = sp["trainable"] / max(sp["total"], 1)
    limit = float(spec.ci.extra.get("max_trainable_share", 0.1))
    result["correct"] = False
    if not losses or not all(math.isfinite(x) for x in losses):
        return _fail(result, "incorrect", f"训练中出现了非有限的损失：{losses}")
    if share > limit:
        return _fail(result, "incorrect", f"可训练参数占 {share:.2%}（{sp['trainable']:,} / {sp['total']:,}），"
                                          f"本题要求参数高效微调：不超过 {limit:.0%}")
    if spec.ci.extra.get("same_start") and abs(losses[0] - base_losses[0]) > spec.atol + spec.rtol * abs(base_losses[0]):
        return _fail(result, "incorrect", f"第 1 步的损失 {losses[0]:.5f} 与全量微调的 {base_losses[0]:.5f} 不同：适配器一开始"
                                          "应当是恒等变换（LoRA 的 B 矩阵初始化为 0），别改动基座模型")
    if not losses[-1] < losses[0]:
        return _fail(result, "incorrect", f"训练 {len(losses)} 步后损失没有下降（{['%.4f' % x for x in losses]}）："
                                          "检查可训练的参数是不是真的接在计算图上")
    result["correct"] = True
    if peak < int(bp.get("static_bytes", 0)):
        return _fail(result, "tamper", f"测得的峰值 {fmt_bytes(peak)} 低于基座模型参数本身的大小 "
                                       f"{fmt_bytes(int(bp['static_bytes']))}：显存计量被绕过了")
    if base_peak and peak > spec.target_ratio * base_peak:
        return _fail(result, "too_much_memory", f"峰值 {fmt_bytes(peak)} 是全量微调（{fmt_bytes(base_peak)}）的 "
                                                f"{peak / base_peak:.2f} 倍，目标是不超过 {spec.target_ratio:.2f} 倍")
    return _passed(spec, result, f"峰值是全量微调的 {result['ratio']:.2f} 倍（目标 ≤ {spec.target_ratio:.2f}），"
                                 f"可训练参数 {sp['trainable']:,} 个（{share:.2%}），损失 {losses[0]:.4f} → {losses[-1]:.4f}")


METRIC_ZH = {"peak_allocated": "峰值显存", "reserved_gap": "已保留与已分配峰值之差（reserved − allocated）"}

JUDGES = {"train_step": _judge_training, "train_epoch": _judge_training, "estimate": _judge_estimate,
          "monitor": _judge_monitor, "load": _judge_load, "call": _judge_call, "max_batch": _judge_max_batch,
          "distill_step": _judge_training, "finetune": _judge_finetune}


def grade_file(exercise_id: str, path, backend: str = "sim", scale: str = "ci", timeout_s: float | None = None,
               memory_limit_bytes: int | None = None, reuse_baseline: bool = False) -> dict:
    """Grade a learner's `.ipynb` (the named function and the imports/definitions it needs are
    taken from its code cells) or `.py` file."""
    from ..exercises import get_exercise

    spec = get_exercise(exercise_id)
    try:
        source = read_submission(path, spec.function)
    except SubmissionError as e:
        result = _base_result(spec, backend, scale)
        result["seconds"] = 0.0
        return _fail(result, e.category, e.reason)
    return grade_source(exercise_id, source, backend=backend, scale=scale, timeout_s=timeout_s,
                        memory_limit_bytes=memory_limit_bytes, _spec=spec, reuse_baseline=reuse_baseline)

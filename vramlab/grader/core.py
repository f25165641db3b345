"""The trusted parent side of the grader.

`grade_source(exercise_id, source)` runs the exercise's starter (trusted) and the learner's code,
each in its own OS sandbox (sandbox.py, policy.py), then judges: the figures of truth come from the
trusted starter's run, the learner's result file is a claim, and the learner's reported peak is
cross-checked with the memory the parent itself read of the learner's process (observer.py). The
exercise's kind (kinds/) then compares peak ratio, results and technique with the starter's. The
result is one JSON-able dict.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import signal
import threading
import time

from . import baselines, cgroup, confine, observer, policy
from . import feedback
from .job import Job
from .records import Result, base_result  # noqa: F401 (base_result: re-exported)
from .sandbox import ChildRun, GraderProblem, run_job
from .kinds import get_kind
from .kinds.common import CATEGORY_ZH, BaselineBroken, fail as _fail, scale_settings  # noqa: F401 (CATEGORY_ZH: re-exported)
from ..units import GiB, fmt_bytes

DEFAULT_TIMEOUT = {"ci": 120, "gpu": 600}
DEFAULT_MEMORY = {"ci": 8 * GiB, "gpu": 48 * GiB}
SANDBOX_MODES = ("auto", "require", "off")     # auto: self-checks warn without bwrap; require: batch grading

_VIOLATION_CATEGORY = {
    "reset_peak": "tamper", "empty_cache": "tamper", "untracked": "tamper", "host": "tamper", "tamper": "tamper",
    "skipped_work": "incorrect",
}


class GraderError(RuntimeError):
    """The grader itself could not run (not the learner's fault): the CLI exits non-zero."""


from .submission import SubmissionError, check_source, notebook_source, parameters, read_submission


# ---------------------------------------------------------------------------------------------------
# Grading
# ---------------------------------------------------------------------------------------------------
# how many torch threads a grading runs with (the cores nothing else keeps busy): threads.py
from .threads import MAX_THREADS, free_cores, torch_threads, usable_cores  # noqa: E402,F401 (re-exported)


def make_job(spec, scale_name: str, backend: str, threads: int | None = None) -> Job:
    """The job a grading's ranks run (written to job.json in the grading's folder): what to build,
    how many steps, which kind and its settings. The same for the starter and the submission."""
    scale = getattr(spec, scale_name)
    settings = scale.settings
    return Job(
        function=spec.function, model=scale.model, config=dict(settings.config),
        batch=scale.batch, seq=scale.seq, steps=scale.steps, warmup=scale.warmup, seed=scale.seed,
        lr=settings.lr, backend=backend, threads=torch_threads(settings.world_size, threads), features_k=2,
        kind=spec.kind, settings=dataclasses.asdict(settings),     # the child: kind.Settings(**settings)
        # hidden cases that change with every grading (ch02): a number copied from feedback is useless
        case_seed=secrets.randbelow(2 ** 31) if get_kind(spec.kind).TRAITS.fresh_case_seed else 0,
        world_size=settings.world_size,
    )


def grade_source(exercise_id: str, source: str, backend: str = "sim", scale: str = "ci",
                 timeout_s: float | None = None, memory_limit_bytes: int | None = None,
                 _spec=None, reuse_baseline: bool = True, sandbox: str = "auto", cores: int | None = None) -> dict:
    """Grade learner code (a Python module defining the exercise's function). Never raises for
    anything the learner did; raises KeyError (unknown exercise) or GraderError (grader broken, or
    `sandbox="require"` on a machine without bubblewrap).

    The trusted starter's run is taken from the baseline cache (baselines.py) when one matches;
    otherwise it is measured in its own sandbox, with the submission's torch threads and beside it
    when the cores allow, and kept. `reuse_baseline=False` measures it afresh. `cores`: how many cores this
    grading may use (a batch of N at once gives each its share); default all of this process's."""
    from ..exercises import get_exercise

    spec = _spec or get_exercise(exercise_id)
    if scale not in ("ci", "gpu"):
        raise GraderError(f"未知规模 {scale!r}：可选 ci、gpu")
    if backend not in ("sim", "cuda"):
        raise GraderError(f"未知后端 {backend!r}：可选 sim、cuda")
    if sandbox not in SANDBOX_MODES:
        raise GraderError(f"未知沙箱模式 {sandbox!r}：可选 {'、'.join(SANDBOX_MODES)}")
    use_sandbox = sandbox != "off" and policy.bwrap_path() is not None
    if sandbox == "require" and not use_sandbox:
        raise GraderError(policy.NO_SANDBOX_REFUSAL)
    t_start = time.perf_counter()
    result = base_result(spec, backend, scale)
    result["sandboxed"] = use_sandbox
    if not use_sandbox:
        result["warnings"] = [policy.IN_KERNEL_SANDBOX_NOTE if os.environ.get("VRAMLAB_IN_KERNEL_SANDBOX")
                              else policy.NO_SANDBOX_WARNING]
    elif cgroup.available() is None:          # no kernel accounting: not an official grade
        if sandbox == "require" and not cgroup.optional():
            raise GraderError(cgroup.NO_CGROUP_REFUSAL)
        result["warnings"] = [cgroup.NO_CGROUP_WARNING]
    try:
        check_source(source, spec.function, parameters(spec.signature))
    except SubmissionError as e:
        result["seconds"] = round(time.perf_counter() - t_start, 2)
        return _fail(result, e.category, e.reason)
    timeout = float(timeout_s or DEFAULT_TIMEOUT[scale])
    memory = int(memory_limit_bytes or DEFAULT_MEMORY[scale])
    run_case = dict(source=source, backend=backend, scale=scale, timeout=timeout, memory=memory,
                    reuse_baseline=reuse_baseline, use_sandbox=use_sandbox, cores=cores)
    result = _grade_case(spec, result, **run_case)
    hidden = getattr(spec, scale).hidden
    result["hidden_cases"] = len(hidden)
    result["hidden_passed"] = 0
    for i, variation in enumerate(hidden if result["passed"] else (), 1):
        case_spec = dataclasses.replace(spec, **{scale: getattr(spec, scale).varied(variation)})
        case = _grade_case(case_spec, base_result(spec, backend, scale), **run_case)
        if not case["passed"]:
            result.update(passed=False, score=0, category=case["category"], hidden_failed=i,
                          violations=case.get("violations", []), hidden_memory=feedback.normalised(case.get("memory")),
                          reason=feedback.hidden_failure_reason(case, variation.changes_zh(), i, len(hidden)))
            break
        result["hidden_passed"] = i
        if result.get("cpu_seconds") is not None and case.get("cpu_seconds") is not None:
            result["cpu_seconds"] = round(result["cpu_seconds"] + case["cpu_seconds"], 3)
        result.setdefault("hidden_ratios", []).append(case["ratio"])     # for the margin tests, not shown
        result["baseline_cached"] = result.get("baseline_cached") and case.get("baseline_cached")
    result["seconds"] = round(time.perf_counter() - t_start, 2)
    return result


def _grade_case(spec, result: Result, *, source: str, backend: str, scale: str, timeout: float, memory: int,
                reuse_baseline: bool, use_sandbox: bool, cores: int | None) -> dict:
    """One configuration: the starter's run (kept or measured now), the learner's run, the verdict."""
    job = make_job(spec, scale, backend, cores)

    runs: dict[str, ChildRun] = {}

    def go(name, src, t):
        try:
            runs[name] = run_job(job.with_(reference=name != "submission"), src, t, memory, use_sandbox=use_sandbox)
        except Exception as e:  # noqa: BLE001 - the grader's own failure (no worker, full disk): reported below
            runs[name] = e

    base_timeout = max(timeout, DEFAULT_TIMEOUT[scale])
    # hidden cases drawn for this grading (ch02) make every starter run its own: nothing to keep
    keep = not job.case_seed
    base_key = baselines.key(spec.id, scale, backend, use_sandbox, job, spec.starter)
    cached = baselines.load(base_key) if reuse_baseline and keep else None
    if cached is not None:
        runs["baseline"] = cached
        go("submission", source, timeout)
    else:           # measured now, twice when it is kept (baselines.py: the noisier one)
        names = ["baseline", "baseline-2"] if keep else ["baseline"]
        todo = [(n, spec.starter, base_timeout) for n in names] + [("submission", source, timeout)]
        # as many runs at once as the cores hold at the job's threads: oversubscribed OpenMP
        # threads spin and slow every run several times over
        at_once = max(1, free_cores(cores) // (job.threads * max(1, job.world_size)))
        for i in range(0, len(todo), at_once):
            group = [threading.Thread(target=go, args=args) for args in todo[i:i + at_once]]
            for th in group:
                th.start()
            for th in group:
                th.join()
        for n in names:
            if not isinstance(runs[n], Exception):
                _check_trusted(runs[n])
        if keep and not any(isinstance(r, Exception) for r in runs.values()):
            runs["baseline"] = baselines.noisier(runs["baseline"], runs["baseline-2"])
            baselines.store(base_key, runs["baseline"])
    for run in runs.values():
        if isinstance(run, Exception):
            raise GraderError(_grader_failure_zh(run)) from run
    base, sub = runs["baseline"], runs["submission"]
    result["baseline_cached"] = cached is not None
    result["cpu_seconds"] = sub.cpu_seconds        # the learner's run only: grade-bench's load-free cost
    result["memory_accounting"] = ("cgroup" if observer.kernel_accounted(sub.observations)
                                   and observer.kernel_accounted(base.observations) else
                                   "rss" if any(o.hwm is not None for o in sub.observations) else None)
    bp = base.payload
    result["baseline_peak_bytes"] = bp.get("peak_bytes")
    result["baseline_step_seconds"] = bp.get("step_seconds")
    kind = get_kind(spec.kind)
    result["memory"] = feedback.memory_view(spec, scale, bp, sub.payload)     # the report's, never the verdict's
    failed = _child_failed(result, sub, timeout, base) or _hidden_memory(result, spec, kind, base, sub)
    if failed:
        return feedback.explain(failed)
    return feedback.explain(judge(kind, spec, result, bp, sub.payload))


def _grader_failure_zh(e: Exception) -> str:
    """A run that could not be made, in Chinese: this machine's problem (a full disk, no GPU: its
    own message says what to do) or the grader's; never the learner's."""
    from ..errors import describe

    return str(e) if isinstance(e, GraderProblem) else f"评分器本身出错了：{describe(e)}"


def _check_trusted(base: ChildRun) -> None:
    bp = base.payload
    if bp is None or not bp.get("ok") or base.protocol_error:
        detail = base.protocol_error or (bp or {}).get("error") or base.stderr_tail[-800:]
        raise GraderError(f"起始代码（可信基线）没能运行，评分器本身有问题：{detail}")
    if bp.get("violations"):
        raise GraderError(f"起始代码（可信基线）触发了评分器的防护，评分器本身有问题：{bp['violations'][:3]}")


def judge(kind, spec, result: Result, bp: dict, sp) -> dict:
    """The kind's verdict on one case, from the starter's payload `bp` and the submission's `sp`
    (what the ranks wrote, already read and bounded). Public so that tests judge recorded runs
    without running anything (tests/test_judges_recorded.py). Judges validate the learner's payload
    themselves; whatever still breaks them on a malformed one is the learner's doing ("tamper"),
    a broken trusted run is the grader's."""
    try:
        return kind.judge(spec, result, bp, sp)
    except BaselineBroken as e:
        raise GraderError(f"起始代码（可信基线）的结果不对，评分器本身有问题：{e}") from None
    except Exception as e:  # noqa: BLE001 - a malformed claim must never crash the grader
        return _fail(result, "tamper", f"结果文件的格式不对（{type(e).__name__}）：结果被改写了")


def _hidden_memory(result: Result, spec, kind, base: ChildRun, sub: ChildRun) -> dict | None:
    """The learner's reported peak against the memory the parent read of its process (observer.py)."""
    if not kind.observed(getattr(spec, result["scale"]).settings):
        return None
    found = observer.hidden_memory(sub.observations, sub.rank_peaks, base.observations, base.rank_peaks)
    if found is None:
        return None
    excess, allowed = found
    allowed += int(float(getattr(scale_settings(spec, result), "observer_slack_mib", 0)) * 2 ** 20)
    result["observed_excess_bytes"] = excess        # an honest run's noise: vramlab grade-bench prints it
    if excess <= allowed:
        return None
    return _fail(result, "tamper", f"评分器在进程外测得的内存比你的代码报告的峰值多用了 {fmt_bytes(excess)}"
                                   f"（起始代码的同一读数作对照，允许误差 {fmt_bytes(allowed)}）：有内存没有经过显存计量，"
                                   "或者计量结果被改写了。把张量藏进 numpy、文件或计量器之外的地方都算作绕过计量")


def _child_failed(result: Result, sub: ChildRun, timeout: float, base: ChildRun) -> dict | None:
    """What every kind judges first: the child ran, kept the protocol, and broke no rule."""
    if sub.timed_out:
        return _fail(result, "timeout", f"超过 {timeout:.0f} 秒仍未结束（死循环？或者每一步太慢）。进程已被终止")
    if sub.protocol_error:
        return _fail(result, "tamper", sub.protocol_error)
    sp = sub.payload
    if sp is None or (observer.AVAILABLE and not any(o.hwm is not None for o in sub.observations)):
        rc = sub.returncode
        if rc == -signal.SIGSYS:           # confine.py's seccomp filter: a process, an exec or an IPC object
            return _fail(result, "forbidden", confine.REASON_ZH)
        why = {-signal.SIGXCPU: "CPU 时间超限", -signal.SIGXFSZ: "输出或写入的文件过大",
               -signal.SIGKILL: "被强制终止（可能内存不足）", -signal.SIGSEGV: "段错误"}.get(rc, f"退出码 {rc}")
        tail = sub.stderr_tail.strip().splitlines()[-3:]
        if "MemoryError" in sub.stderr_tail or "std::bad_alloc" in sub.stderr_tail:
            return _fail(result, "oom", "进程内存不足被终止")
        return _fail(result, "crashed", f"评分进程在给出结果之前就结束了（{why}）。是不是调用了 os._exit() "
                                        f"或 os.abort()？" + (f" 最后的输出：{' | '.join(tail)}" if tail else ""))
    extra = [p for o in sub.observations for p in o.extra_processes]
    if extra:
        return _fail(result, "forbidden", f"评分期间启动了 {len(extra)} 个额外的进程：本题只允许在评分进程里计算")
    written = observer.excess_written(sub.observations, base.observations)
    if written > observer.WRITE_LIMIT_BYTES:
        return _fail(result, "tamper", f"评分期间比起始代码多写出了 {fmt_bytes(written)} 的数据（文件、管道或共享内存）："
                                       "把张量存到显存计量之外不算省显存")
    violations = sp.get("violations") or []
    if not isinstance(violations, list) or not all(isinstance(v, (list, tuple)) and len(v) == 2 for v in violations):
        return _fail(result, "tamper", "结果文件的格式不对：结果被改写了")
    result["violations"] = [{"category": str(c), "detail": str(d)} for c, d in violations]
    err = sp.get("error")
    if violations:
        cats = [_VIOLATION_CATEGORY.get(c, "forbidden") for c, _ in violations]
        cat = "tamper" if "tamper" in cats else ("forbidden" if "forbidden" in cats else cats[0])
        details = "；".join(dict.fromkeys(str(d) for _, d in violations))
        return _fail(result, cat, details)
    if err:
        if not isinstance(err, dict):
            return _fail(result, "tamper", "结果文件的格式不对：结果被改写了")
        kind = err.get("kind")
        cat = {"exit": "exit", "oom": "oom", "missing_function": "invalid_submission",
               "incorrect": "incorrect", "tamper": "tamper"}.get(kind, "exception")
        message = str(err.get("message", ""))
        if "failed to map segment from shared object" in message:     # a native module in a noexec folder
            return _fail(result, "forbidden", "评分时不允许加载提交里带来的本机代码（.so）：评分目录挂载为 noexec")
        if cat == "incorrect":      # the harness's own words, not an exception's repr
            message = message.split(": ", 1)[-1] if message.startswith("WrongAnswer: ") else message
        return _fail(result, cat, message)
    if not sp.get("ok"):
        return _fail(result, "tamper", "结果文件说评分没有完成，却没有给出原因：结果被改写了")
    return None


def grade_file(exercise_id: str, path, backend: str = "sim", scale: str = "ci", timeout_s: float | None = None,
               memory_limit_bytes: int | None = None, reuse_baseline: bool = True, sandbox: str = "auto",
               cores: int | None = None) -> dict:
    """Grade a learner's `.ipynb` (the named function and the imports/definitions it needs are
    taken from its code cells) or `.py` file."""
    from ..exercises import get_exercise

    spec = get_exercise(exercise_id)
    try:
        source = read_submission(path, spec.function)
    except SubmissionError as e:
        result = base_result(spec, backend, scale)
        result["seconds"] = 0.0
        return _fail(result, e.category, e.reason)
    return grade_source(exercise_id, source, backend=backend, scale=scale, timeout_s=timeout_s,
                        memory_limit_bytes=memory_limit_bytes, _spec=spec, reuse_baseline=reuse_baseline, sandbox=sandbox,
                        cores=cores)

"""The grader's two records, every key in one place.

`Payload` is what a rank writes to result-RANK.json (harness.py, the kind's scenario): a claim,
except for the trusted starter's run. `Result` is what a grading returns: core.base_result starts
it, the checks of core.py and the kind's judge fill it in, feedback.py and report.py read it.
Both stay plain JSON-able dicts (they cross a process boundary and land in CSVs, caches and
recordings); these TypedDicts say which keys exist, and tests/test_records.py fails on a key the
code spells that is not declared here.
"""
from __future__ import annotations

from typing import Any, TypedDict


class Payload(TypedDict, total=False):
    # the harness, every kind
    ok: bool                          # the run finished; False with `error` when the learner's code failed
    stage: str                        # how far it got: setup, load, run, done
    violations: list                  # [category, detail] pairs from the guards
    error: dict | None                # {"kind", "message"}: the learner's code failed
    backend: str                      # sim or cuda
    torch_version: str
    memory: dict                      # memtrace's timeline summary (sim): feedback only, never the verdict
    param_count: int                  # parameters of the job's model
    static_bytes: int                 # the physical floor of a training step (build.static_bytes)
    peak_bytes: int                   # the peak allocated device memory (the worst rank's, merged)
    rank_peak_bytes: list             # each rank's peak (world_size > 1, sandbox.merge_ranks)
    step_seconds: float               # the fastest measured step/call
    # training kinds (training.py, train_step, train_epoch, distill_step, finetune)
    losses: list                      # one per step (per rank, merged)
    update: list                      # the parameters' fingerprint change over the run
    breakdown: dict                   # the simulated device's bytes by category at the peak
    first_step_peak_bytes: int        # the peak after the first step (a leak grows after it)
    technique: dict                   # what technique.Probe saw while the learner trained
    host_copy_bytes: int | None       # bytes copied to host per measured step (ch28)
    trainable: int                    # finetune: trainable parameters
    total: int                        # finetune: all parameters
    method_error: str | None          # finetune: why the method is not the one asked for
    uncovered: list                   # finetune: modules the method should have covered
    # call
    outputs: list                     # the function's outputs, per call (per rank, merged)
    metric_bytes: int                 # what the exercise measures (peak, reserved - peak ...)
    reserved_peak_bytes: int
    floor_bytes: int                  # bytes the inputs and outputs alone take
    flops: float                      # counted floating point operations
    # load
    fingerprint: list                 # the loaded model's parameters' projections
    model_bytes: int                  # the model's weights in bytes
    dtypes: list                      # the parameters' dtypes
    on_device: bool                   # every parameter in device memory
    host_peak_bytes: int | None       # host memory the load used at its peak
    # estimate, monitor
    answers: list                     # the learner's numbers, one per case
    truths: list | None               # the measured ones (the trusted run only)
    cases: list                       # the cases asked (estimate)
    # max_batch
    answer: int                       # the largest batch the learner's search found
    trials: list                      # [batch, fits] the search tried
    verified: bool                    # the trusted run's linear search checked its answer
    starter_answer: Any               # the trusted run: what the starter answered, beside the linear search's `answer`


class Result(TypedDict, total=False):
    # every grading (core.base_result): what a report reads
    exercise: str
    kind: str
    passed: bool
    score: int
    max_score: int
    category: str | None              # ok or why not (kinds.common.CATEGORY_ZH)
    reason: str                       # the learner-facing verdict, in Chinese
    peak_bytes: int | None            # the learner's peak (or the figure the kind compares)
    baseline_peak_bytes: int | None   # the trusted starter's
    ratio: float | None               # the learner's figure over the starter's
    target_ratio: float | None        # the spec's bar for `ratio`
    correct: bool | None              # the learner's results match the starter's
    backend: str
    scale: str                        # ci or gpu
    time_ratio: float | None          # the learner's step time over the starter's
    step_seconds: float | None
    baseline_step_seconds: float | None
    max_time_ratio: float | None      # the spec's bar for `time_ratio`
    loss_max_rel_err: float | None    # the worst loss's relative error against the starter's
    update_rel_err: float | None      # the parameter update's relative error against the starter's
    violations: list                  # {"category", "detail"} from the guards
    hints: list                       # the spec's hints, shown with a failure
    seconds: float | None             # wall time of the whole grading
    # how it was graded (core.grade_source, deadline.py)
    sandboxed: bool                   # ran in bubblewrap
    warnings: list                    # why this is not an official grade (no sandbox, no cgroup)
    baseline_cached: bool             # the starter's run came from the cache (baselines.py)
    cpu_seconds: float | None         # CPU time of the learner's runs
    memory_accounting: str | None     # cgroup, rss or None: how the parent observed memory
    observed_excess_bytes: int        # memory seen from outside beyond the reported peak
    memory: dict | None               # the memory view for feedback (feedback.memory_view)
    deadline_s: float                 # the limit of a grading stopped at its deadline
    # hidden cases (core.grade_source)
    hidden_cases: int
    hidden_passed: int
    hidden_failed: int                # which one failed (1-based)
    hidden_memory: dict | None        # the failed hidden case's memory view
    hidden_ratios: list               # each hidden case's ratio: for the margin tests, not shown
    # kind-specific figures
    rank_peak_bytes: list | None      # each rank's peak (world_size > 1)
    savings: dict                     # bytes saved by category against the starter (training)
    host_copy_bytes: int              # training: bytes copied to host per step (ch28)
    host_copy_ratio: float | None     # training: those bytes over the starter's peak
    metric: str                       # call: what the exercise measures
    metric_bytes: int                 # call: the learner's measure
    baseline_metric_bytes: int        # call: the starter's
    flops_ratio: float                # call: the learner's counted FLOPs over the starter's
    host_peak_bytes: int | None       # load: host memory at the load's peak
    trainable: int                    # finetune: trainable parameters
    total: int                        # finetune: all parameters
    answer: int                       # max_batch: the learner's answer
    baseline_answer: int              # max_batch: the verified one
    trials: int                       # max_batch: how many batches the search tried
    allowed_trials: int               # max_batch: how many it may try


def base_result(spec, backend: str, scale: str) -> Result:
    """A result before any judging: 0 points, no category; every field a report reads is present."""
    return Result(
        exercise=spec.id, kind=spec.kind, passed=False, score=0, max_score=spec.points, category=None,
        reason="", peak_bytes=None, baseline_peak_bytes=None, ratio=None,
        target_ratio=spec.target_ratio, correct=None, backend=backend, scale=scale,
        time_ratio=None, step_seconds=None, baseline_step_seconds=None, max_time_ratio=spec.max_time_ratio,
        loss_max_rel_err=None, update_rel_err=None, violations=[], hints=list(spec.hints),
        seconds=None,
    )

"""One exercise = one spec. The learner notebook (exercises/), the reference solution (solutions/),
the grader and the course page are all generated from, or check against, this one object.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Scale:
    """A workload size: `ci` runs in seconds on a CPU (simulated device); `gpu` is sized for a real card."""
    model: str                     # vramlab.models preset
    batch: int
    seq: int
    steps: int = 3                 # optimizer steps; the peak is measured after `warmup` of them
    warmup: int = 1
    extra: dict = field(default_factory=dict)   # exercise-specific knobs (e.g. micro_batch, budget)


@dataclass(frozen=True)
class ExerciseSpec:
    id: str                        # e.g. "ch07-checkpoint"
    chapter: int
    title: str                     # Chinese
    task: str                      # Chinese markdown: what to do and why
    function: str                  # name of the function the learner writes
    signature: str                 # e.g. "def train_step(model, optimizer, batch, device):"
    starter: str                   # full source of the starter function: correct, but too much memory
    solution: str                  # full source of the reference solution
    ci: Scale
    gpu: Scale
    target_ratio: float            # pass if peak <= target_ratio * starter peak (same run, same backend)
    rtol: float = 1e-4             # correctness: losses/parameters vs the starter's after the steps
    atol: float = 1e-5
    update_rtol: float = 1e-3      # correctness: ||update - starter's update|| / ||starter's update||
                                   # (updates compared through fixed random projections per tensor)
    technique: str | None = None   # required technique, checked by counting calls in the harness:
                                   # "accumulation" (>= 2 model forwards per step), "autocast"
                                   # (forward under autocast), "checkpoint" (blocks recomputed)
    max_time_ratio: float | None = None   # optional: step time <= this x the starter's
    absolute_budget: str | None = None    # optional: e.g. "2 GiB" on a virtual card
    points: int = 10
    hints: tuple[str, ...] = ()    # Chinese: what to try next when it fails
    metric: str = "steady_peak_allocated"

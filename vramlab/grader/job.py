"""The job: what one grading's ranks run, the same for the starter and the submission.

The parent (core.make_job) builds it, sandbox.py writes it to job.json (`to_dict()`), the harness
reads it back (`Job.from_dict`) and the kind's scenario reads its fields (`h.job.batch`). Frozen:
a run that needs another value makes another job (`job.with_(reference=True)`).

`to_dict()` is the job file and part of the baseline cache key (baselines.py) and of the recorded
runs' keys (tests/recorded_runs.py): the optional fields appear only when set, so adding one here
changes no key.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

OPTIONAL = ("reference", "source_file", "init_method", "dist_timeout", "probe_seed")


@dataclass(frozen=True)
class Job:
    # What to build and how long to run it: the exercise scale's model and data, identical for the
    # starter and the submission so that their peaks compare.
    function: str                   # the learner's function the scenario calls
    model: str                      # the model preset (vramlab.models)
    config: dict[str, Any]          # overrides of the preset's config (a hidden case's, too)
    batch: int
    seq: int
    steps: int
    warmup: int                     # steps before the peak is measured
    seed: int                       # model init; data from seed + 1, the scenarios' own from seed + 2
    lr: float

    # Where and how it runs: the device and the CPU share, chosen by the parent for this machine.
    backend: str                    # "sim" or "cuda"
    threads: int                    # torch threads per rank
    features_k: int                 # random projections per tensor in a parameter fingerprint

    # What the exercise's kind needs: its typed settings as a plain dict, a case drawn per grading.
    kind: str
    settings: dict[str, Any]        # the child: kind.Settings(**settings)
    case_seed: int                  # 0, or hidden cases that change with every grading (ch02)
    world_size: int                 # ranks (data parallel)

    # Set per run by the parent, absent from the job file unless set: keys stay what they were.
    reference: bool | None = None   # the trusted starter's run (the truth), not the learner's
    source_file: str | None = None  # the code to run, as the sandbox sees it
    init_method: str | None = None  # where the ranks meet (world_size > 1)
    dist_timeout: float | None = None   # seconds the ranks wait for each other (default 300)
    probe_seed: int | None = None   # seed of the fingerprint's directions (default 1234)

    def to_dict(self) -> dict:
        """The job file's JSON: every field, less the optional ones that are not set."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in d.items() if not (k in OPTIONAL and v is None)}

    @classmethod
    def from_dict(cls, d: dict) -> "Job":
        return cls(**d)

    def with_(self, **changes) -> "Job":
        return dataclasses.replace(self, **changes)


__all__ = ["Job"]

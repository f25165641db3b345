"""Exercise kinds: what the grader's child runs and how the parent judges it, one module per kind.

Every kind module exports the same contract:
- `Settings`: frozen dataclass of the kind's per-exercise knobs (a spec's `Scale.settings`; the job
  carries it as a plain dict, the child rebuilds it with `Settings(**d)`);
- `PERMISSIONS` and `permissions(settings)`: the defence-in-depth guards this kind relaxes;
- `OBSERVED` and `observed(settings)`: whether the parent's outside-the-sandbox RSS cross-check applies;
- `scenario(h)`: child side, trusted set-up before the learner's code loads; returns `run(fn)`;
- `judge(spec, result, bp, sp)`: parent side; `bp` is the trusted starter's payload, `sp` the
  learner's (a claim: validated, never the source of a truth);
- `criteria_zh(spec)`: the pass criteria the learner reads (Chinese Markdown bullets);
- `TRAITS`: a `common.Traits`: the kind's words and habits that the notebook, the exercise page, the
  report and the feedback need (they never compare a kind's name).
Adding a kind = one module + one line in KINDS.
"""
from __future__ import annotations

from . import call, distill_step, estimate, finetune, load, max_batch, monitor, train_epoch, train_step

KINDS = {
    "train_step": train_step,
    "train_epoch": train_epoch,
    "estimate": estimate,
    "monitor": monitor,
    "load": load,
    "call": call,
    "max_batch": max_batch,
    "distill_step": distill_step,
    "finetune": finetune,
}
CONTRACT = ("Settings", "PERMISSIONS", "permissions", "OBSERVED", "observed", "scenario", "judge", "criteria_zh",
            "TRAITS")


def get_kind(name: str):
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown exercise kind {name!r}; known: {', '.join(KINDS)}") from None


def traits(name: str | None):
    """The kind's Traits; the defaults for a name no kind has (a malformed or foreign result)."""
    from .common import Traits

    kind = KINDS.get(name or "")
    return kind.TRAITS if kind is not None else Traits()


def settings_from(name: str, data: dict):
    """The kind's Settings from the job's plain dict (what the child does with job.settings)."""
    return get_kind(name).Settings(**data)

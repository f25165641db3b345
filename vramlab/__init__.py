"""vramlab — 显存优化实战 (measure, simulate and grade GPU memory).

    import vramlab
    with vramlab.SimDevice() as dev:         # or vramlab.open_device("auto")
        ...                                   # build the model and train inside
    print(dev.max_allocated())

    m = vramlab.measure(step_fn, backend="sim")  # peak of a callable on a fresh device
    with vramlab.device_budget("2 GiB"): ...     # a virtual card that raises OutOfMemoryError
    vramlab.estimate(vramlab.Workload(model="gpt2-small"))  # analytic estimate with a breakdown
    s = vramlab.exercise_setup("ch07-checkpoint")  # an exercise's model, optimizer, batch and device as graded
"""
from importlib import import_module

__version__ = "0.1.0"

LAZY = {      # public name -> the module that defines it (vramlab.tutorials reads it for the freshness hash)
    "SimDevice": "vramlab.sim.device", "CudaDevice": "vramlab.cuda",
    "measure": "vramlab.meter", "measure_steps": "vramlab.meter", "open_device": "vramlab.meter",
    "Measurement": "vramlab.meter", "device_budget": "vramlab.budget",
    "estimate": "vramlab.estimate", "Workload": "vramlab.workload", "build_model": "vramlab.models",
    "measure_workload": "vramlab.runner", "build_training": "vramlab.runner",
    "check": "vramlab.grader.notebook_check", "exercise_setup": "vramlab.graded",
}


def __getattr__(name):          # import torch only when something needs it
    if name in LAZY:
        return getattr(import_module(LAZY[name]), name)
    raise AttributeError(f"module 'vramlab' has no attribute {name!r}")

"""Memory timelines ("traces") for the website's timeline viewer (docs/tools/timeline.md).

A trace is one JSON object (`format.FORMAT`): allocated bytes after every allocation and free,
split by category, the reserved bytes, and the op and module at the peak. Two producers:

    vramlab.trace.sim.record_workload(w)      a Workload run on the simulated device
    vramlab.trace.cuda.from_snapshot(snap)    torch.cuda.memory._snapshot() from a real GPU

`python -m vramlab.trace` regenerates the traces the website ships (docs/assets/traces/);
`vramlab trace` does the same for one workload or converts a CUDA snapshot pickle.
"""

#!/usr/bin/env bash
# Everything the course needs a GPU for, in one command, on a machine with one NVIDIA GPU
# (after README's set-up: `make install` takes PyPI's CUDA build of torch on such a machine):
#
#   scripts/gpu_evidence.sh OUTDIR
#
# calibrates the simulated device against the card (every H200 reference row), grades every
# reference solution and starter on CUDA at GPU scale (4 at a time, each in its own sandbox and
# process), and executes every tutorial on the card; writes OUTDIR/evidence.json and
# OUTDIR/summary.md (see vramlab/evidence.py). Then commit OUTDIR/evidence.json as
# vramlab/data/evidence/<gpu>.json (vramlab/data/evidence/README.md) and the site shows it.
# Extra arguments go to `vramlab evidence` (e.g. --jobs 8, --only ch07-checkpoint).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
    echo "用法：scripts/gpu_evidence.sh OUTDIR [vramlab evidence 的其他参数]" >&2
    exit 2
fi
OUTDIR="$1"; shift
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" -m vramlab.evidence "$OUTDIR" --backend cuda --scale gpu --tutorials "$@"

#!/usr/bin/env bash
# 从练习规格重新生成 nbgrader 源 notebook（solutions/）和学员 notebook（exercises/）。
#   scripts/generate_exercises.sh            # 全部练习
#   scripts/generate_exercises.sh ch07-checkpoint
#   scripts/generate_exercises.sh --check    # 只检查：临时目录里重新生成并与仓库比较（CI 用）
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
if [ "${1:-}" = "--check" ]; then
    shift
    exec "$PY" -m vramlab.notebooks --check "$@"
fi
exec "$PY" -m vramlab.notebooks --release "$@"

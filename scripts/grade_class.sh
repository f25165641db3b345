#!/usr/bin/env bash
# 在一台机器上并行评分一个班的提交（不经过 nbgrader 的成绩库），带进度条，结果写成 CSV。
#   scripts/grade_class.sh                                   # nbgrader/submitted/*/*/*.ipynb，2 个 worker
#   WORKERS=8 scripts/grade_class.sh nbgrader/submitted/*/ch07-checkpoint/*.ipynb
#   OUT=grades.csv BACKEND=cuda scripts/grade_class.sh
# 每份提交调用一次 vramlab.grader.grade_file（与 vramlab.check / vramlab grade 相同的隔离评分器）；
# 某一份出错只记为 0 分并写明原因，不会中断整批。在 GPU 上 WORKERS 不要超过显卡数。
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" -m vramlab.batch --workers "${WORKERS:-2}" --backend "${BACKEND:-sim}" \
    --csv "${OUT:-nbgrader/vramlab_grades.csv}" "$@"

#!/usr/bin/env bash
# 在一台机器上并行评分一个班的提交（不经过 nbgrader 的成绩库），带进度条，结果写成 CSV。
#   scripts/grade_class.sh                                   # nbgrader/submitted/*/*/*.ipynb，2 个 worker
#   WORKERS=8 scripts/grade_class.sh nbgrader/submitted/*/ch07-checkpoint/*.ipynb
#   OUT=grades.csv BACKEND=cuda scripts/grade_class.sh
#   scripts/grade_class.sh --fresh                           # 不复用已有成绩，从头评（旧 journal 改名为 .bak）
# 每份提交调用一次 vramlab.grader.grade_file（与 vramlab.check / vramlab grade 相同的隔离评分器）；
# 某一份出错只记为 0 分并写明原因，不会中断整批。在 GPU 上 WORKERS 不要超过显卡数。
# 每评完一份就追加到 $OUT.journal.jsonl：Ctrl-C、kill、终端断开或断电之后，用同一条命令重跑，
# 只评还没评的和改过的提交；中断时已评的成绩也会写进 CSV（退出码 130 / 143 / 129）。
# 每份评分有总时限（默认：每个用例的运行时限之和 + 300 秒；--deadline 秒数或环境变量 VRAMLAB_DEADLINE_S 可改）：
# 超过的记为这份提交超时（0 分，写进 CSV 和 journal），卡住的评分进程被杀掉，整批继续。
# 开始评分前，上一次的 CSV 改名为 $OUT.prev，所以被 kill -9 的批次不会留下看起来像是新的旧 CSV。
# 退出码：0 全部评完；2 参数错误或 CSV 写不进去；4 有评分器出错的行（重跑只重评它们）或本机不能评分
# （没有沙箱、没有 GPU、临时磁盘满）。见 docs/guide/grading.md 的“退出码”。
# WORKERS 由 vramlab.grader.batch 自己读取（不是正整数时给出中文错误）；其余参数原样传给它。
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" -m vramlab.grader.batch --backend "${BACKEND:-sim}" --csv "${OUT:-nbgrader/vramlab_grades.csv}" "$@"

"""Subcommands `vramlab exercises`, `vramlab grade`, `vramlab grade-class` (grader/slurm.py) and `vramlab grade-bench`.

`vramlab grade` exits 0 once the submission is graded (whatever the score), 2 for bad arguments
(an unknown exercise, a bad --timeout), 3 when the submission cannot be read (missing, a folder,
empty, binary, not a notebook), 4 when this machine or the grader cannot grade (no GPU for
--backend cuda, a full temp disk, no sandbox with --sandbox require, a grader failure) and 128+N
when a stop signal ends it (its gradings' processes killed, their folders removed). With --json
it prints one JSON object on stdout either way: the result, or {"error": ..., "message": ...,
"exit_code": ..., "exercise": ..., "path": ...}.
"""
from __future__ import annotations

import json
import stat
import sys
from pathlib import Path


def cmd_exercises(args):
    from ..exercises import list_exercises

    items = list_exercises(instructor=args.instructor)
    if args.json:
        print(json.dumps(items, ensure_ascii=False))
        return 0
    print("练习列表（教师视图）：" if args.instructor else "练习列表：")
    for it in items:
        print(f"  {it['id']:<22} 第 {it['chapter']} 章  {it['title']}")
        print(f"  {'':<22} 函数 {it['function']}，目标峰值 ≤ 起始代码的 {it['target_ratio']:.2f} 倍，{it['points']} 分")
        print(f"  {'':<22} 练习 {it['notebook']}")
        if args.instructor:
            print(f"  {'':<22} 参考答案 {it['solution']}（nbgrader 源 notebook），规格 {it['spec']}")
    return 0


def unreadable(path) -> str | None:
    """Why the file at `path` cannot be a submission (Chinese), or None: missing, a folder, not a
    regular file, unreadable, empty, not UTF-8 text, or (.ipynb) not a notebook."""
    from ..errors import os_error_zh

    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        return f"找不到提交的文件 {p}"
    except OSError as e:
        return f"无法读取提交的文件 {os_error_zh(e)}"
    if stat.S_ISDIR(st.st_mode):
        return f"{p} 是一个文件夹，不是提交的文件：请给出其中的 .ipynb 或 .py 文件"
    if not stat.S_ISREG(st.st_mode):
        return f"{p} 不是普通文件"
    try:
        raw = p.read_bytes()
    except OSError as e:
        return f"无法读取提交的文件 {os_error_zh(e)}"
    if not raw.strip():
        return f"提交的文件 {p} 是空的"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return f"提交的文件 {p} 不是 UTF-8 文本（可能是二进制文件或压缩包）"
    if p.suffix == ".ipynb":
        try:
            nb = json.loads(text)
        except ValueError:
            return f"{p} 不是合法的 notebook（不是 JSON）：请在 Jupyter 里重新保存，或从 exercises/ 重新复制一份"
        if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
            return f"{p} 不是 Jupyter notebook（缺少 cells 字段）"
    return None


def cmd_grade(args):
    from ..args import report_error
    from ..errors import EXIT_GRADER, EXIT_UNREADABLE, EXIT_USAGE, describe
    from ..exercises import get_exercise
    from . import deadline
    from .core import GraderError, grade_file
    from .report import format_result
    from .sandbox import GraderProblem, require_backend

    where = {"exercise": args.exercise, "path": args.path}
    try:
        get_exercise(args.exercise)
    except KeyError as e:
        return report_error(describe(e), EXIT_USAGE, args.json, **where)
    try:
        deadline.from_env()
    except ValueError as e:
        return report_error(str(e), EXIT_USAGE, args.json, **where)
    reason = unreadable(args.path)
    if reason:
        return report_error(reason, EXIT_UNREADABLE, args.json, **where)
    try:
        require_backend(args.backend)         # before any child starts: said once, not per run
        # the whole grading under a wall-clock deadline: past it, this submission's timeout (deadline.py)
        result = deadline.run(lambda: grade_file(args.exercise, args.path, backend=args.backend, scale=args.scale,
                                                 timeout_s=args.timeout,
                                                 sandbox="off" if args.no_sandbox else args.sandbox),
                              args.exercise, args.backend, args.scale, args.timeout, args.deadline)
    except (GraderError, GraderProblem) as e:
        return report_error(str(e), EXIT_GRADER, args.json, **where)
    saved = _save_figure(result, args.figure) if args.figure else None
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        print(format_result(result, figure_path=saved))
        if not args.figure and _has_figure(result):
            print("  时间线图           加上 --figure 图.svg 把它存成文件（用浏览器打开）")
    return 0


def _has_figure(result: dict) -> bool:
    from .report import figure_of

    return figure_of(result) is not None


def _save_figure(result: dict, path: str) -> str | None:
    """Write the report's timeline figure (SVG) to `path`; None (and a Chinese note on stderr) when
    there is none to write (CUDA backend, estimate exercises) or the file cannot be written."""
    from ..errors import os_error_zh
    from .report import figure_of

    svg = figure_of(result)
    if svg is None:
        print("没有可画的时间线图：只有模拟设备上的训练类练习记录每一步的显存", file=sys.stderr)
        return None
    try:
        Path(path).write_text(svg + "\n", encoding="utf-8")
    except OSError as e:
        print(f"时间线图没能保存：{os_error_zh(e)}", file=sys.stderr)
        return None
    return str(path)


def cmd_grade_bench(args):
    from .bench import default_load, run, select

    only = select(_exercise_ids(args.only) if args.only is not None else None, chapters=args.chapters)
    if args.noise:
        from .bench import noise
        noise(only, args.noise, args.alternatives, scale=args.scale, as_json=args.json, record=args.record)
        return 0
    run(as_json=args.json, scale=args.scale, measure_starters=args.starters,
        only=only, sandbox="off" if args.no_sandbox else "auto",
        compare=args.compare, class_size=args.class_size, workers=args.workers, class_only=args.class_only,
        load=(args.load if args.load >= 0 else default_load()), record=args.record)
    return 0


def _exercise_ids(text: str) -> list[str]:
    """Comma-separated exercise ids, each a known one (else a Chinese CliError, exit 2)."""
    from ..args import CliError
    from ..exercises import EXERCISES

    ids = [i.strip() for i in text.split(",") if i.strip()]
    unknown = [i for i in ids if i not in EXERCISES]
    if unknown or not ids:
        raise CliError(f"未知练习 {', '.join(unknown) or '（空）'}；可选：{'、'.join(EXERCISES)}")
    return ids


def add_commands(sub):
    from ..args import non_negative_int, positive_int, positive_seconds

    e = sub.add_parser("exercises", help="列出评分练习（编号、函数、目标、分值、notebook 路径）")
    e.add_argument("--json", action="store_true", help="输出 JSON")
    e.add_argument("--instructor", action="store_true", help="教师：同时列出每道练习参考答案所在的文件")
    e.set_defaults(func=cmd_exercises)
    g = sub.add_parser("grade", help="评分：在操作系统沙箱里运行提交的函数，对比起始代码的峰值显存与结果")
    g.add_argument("exercise", help="练习编号，例如 ch05-accumulation（见 vramlab exercises）")
    g.add_argument("path", help="提交的 .ipynb 或 .py 文件")
    g.add_argument("--json", action="store_true", help="输出一个 JSON 对象")
    g.add_argument("--backend", choices=("sim", "cuda"), default="sim")
    g.add_argument("--scale", choices=("ci", "gpu"), default="ci")
    g.add_argument("--timeout", type=positive_seconds, default=None, help="提交代码的运行时限（秒，大于 0；默认按规模 120 或 600）")
    g.add_argument("--deadline", type=positive_seconds, default=None,
                   help="整份评分的总时限（秒，大于 0；含准备、起始代码和隐藏用例）。默认取环境变量 VRAMLAB_DEADLINE_S，"
                        "否则为每个用例的运行时限之和再加 300 秒余量；超过的记为这份提交超时（0 分）")
    g.add_argument("--sandbox", choices=("auto", "require"), default="auto",
                   help="auto（默认）：有 bubblewrap 就在操作系统沙箱里运行，没有就警告；require：没有沙箱就拒绝评分（正式评分用）")
    g.add_argument("--no-sandbox", action="store_true", help="不用沙箱（只在信任提交者时使用）")
    g.add_argument("--figure", metavar="图.svg",
                   help="把时间线图（起始代码与你的代码每一步的已分配显存，SVG）保存到这个文件")
    g.set_defaults(func=cmd_grade)
    gc = sub.add_parser("grade-class", add_help=False,
                        help="给一个班评分：本机并行批量评分，或加 --slurm 在 Slurm 集群上用一个作业数组评分（同样的 CSV）")
    gc.add_argument("rest", nargs="*")         # grader/slurm.py parses (and explains) its own options
    gc.set_defaults(func=lambda args: __import__("vramlab.grader.slurm", fromlist=["main"]).main(args.rest))
    b = sub.add_parser("grade-bench", help="评分的耗时：每个练习参考答案的评分延迟，可选与以前做法的对比和全班吞吐")
    b.add_argument("--json", action="store_true")
    b.add_argument("--scale", choices=("ci", "gpu"), default="ci")
    b.add_argument("--starters", action="store_true", help="同时给起始代码评分（应当不通过）")
    b.add_argument("--only", help="只评这些练习（逗号分隔的编号）")
    b.add_argument("--chapters", action="store_true", help="只用 30 章各自的练习（不含 3 道阶段挑战）")
    b.add_argument("--no-sandbox", action="store_true", help="不用操作系统沙箱（对比沙箱的开销）")
    b.add_argument("--compare", action="store_true",
                   help="同时按以前的做法（每次新起解释器、每次重测起始代码）评一次，打印两者之比")
    b.add_argument("--class-size", type=non_negative_int, default=0, help="再用批量评分给 N 份参考答案的副本评分，打印全班吞吐")
    b.add_argument("--workers", type=positive_int, default=2, help="全班评分时同时评的份数（默认 2）")
    b.add_argument("--class-only", action="store_true", help="只测全班吞吐，不逐题测单次评分")
    b.add_argument("--load", type=int, nargs="?", const=-1, default=0, metavar="N",
                   help="每题再在 N 个忙循环进程同时运行时评一次，和空闲时的耗时一起打印（不写 N：除一个核以外全占满）")
    b.add_argument("--noise", type=positive_int, default=0, metavar="N",
                   help="改为测诚实提交的进程外读数噪声：参考答案（和 --alternatives 里标着 pass 的写法）各评 N 次，"
                        "打印“进程外多用”的分布和允许误差")
    b.add_argument("--alternatives", metavar="DIR", help="与 --noise 一起用：其他正确写法所在的文件夹，例如 tests/alternatives")
    b.add_argument("--record", action="store_true",
                   help="把这次 --noise 或 --load 的结果追加到 vramlab/data/perf/history.jsonl（网站的「性能与测量记录」页由它生成）")
    b.set_defaults(func=cmd_grade_bench)


__all__ = ["add_commands", "unreadable"]
if __name__ == "__main__":  # pragma: no cover
    print("用法：vramlab exercises|grade|grade-bench（这个模块本身不是命令）", file=sys.stderr)
    sys.exit(2)

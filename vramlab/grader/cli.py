"""Subcommands `vramlab exercises`, `vramlab grade` and `vramlab grade-bench`."""
from __future__ import annotations

import json
import sys


def cmd_exercises(args):
    from ..exercises import list_exercises

    items = list_exercises()
    if args.json:
        print(json.dumps(items, ensure_ascii=False))
        return 0
    print("练习列表：")
    for it in items:
        print(f"  {it['id']:<22} 第 {it['chapter']} 章  {it['title']}")
        print(f"  {'':<22} 函数 {it['function']}，目标峰值 ≤ 起始代码的 {it['target_ratio']:.2f} 倍，{it['points']} 分")
        print(f"  {'':<22} 练习 {it['notebook']}   参考答案 {it['solution']}")
    return 0


def cmd_grade(args):
    from ..exercises import get_exercise
    from .core import grade_file
    from .report import format_result

    get_exercise(args.exercise)          # unknown id: KeyError -> exit 2 with the Chinese message
    result = grade_file(args.exercise, args.path, backend=args.backend, scale=args.scale,
                        timeout_s=args.timeout, sandbox="off" if args.no_sandbox else args.sandbox)
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        print(format_result(result))
    return 0


def cmd_grade_bench(args):
    from .bench import run

    run(as_json=args.json, scale=args.scale, measure_starters=args.starters,
        only=args.only.split(",") if args.only else None, sandbox="off" if args.no_sandbox else "auto",
        compare=args.compare, class_size=args.class_size)
    return 0


def add_commands(sub):
    e = sub.add_parser("exercises", help="列出评分练习（编号、函数、目标、分值、notebook 路径）")
    e.add_argument("--json", action="store_true", help="输出 JSON")
    e.set_defaults(func=cmd_exercises)
    g = sub.add_parser("grade", help="评分：在操作系统沙箱里运行提交的函数，对比起始代码的峰值显存与结果")
    g.add_argument("exercise", help="练习编号，例如 ch05-accumulation（见 vramlab exercises）")
    g.add_argument("path", help="提交的 .ipynb 或 .py 文件")
    g.add_argument("--json", action="store_true", help="输出一个 JSON 对象")
    g.add_argument("--backend", choices=("sim", "cuda"), default="sim")
    g.add_argument("--scale", choices=("ci", "gpu"), default="ci")
    g.add_argument("--timeout", type=float, default=None, help="提交代码的运行时限（秒）")
    g.add_argument("--sandbox", choices=("auto", "require"), default="auto",
                   help="auto（默认）：有 bubblewrap 就在操作系统沙箱里运行，没有就警告；require：没有沙箱就拒绝评分（正式评分用）")
    g.add_argument("--no-sandbox", action="store_true", help="不用沙箱（只在信任提交者时使用）")
    g.set_defaults(func=cmd_grade)
    b = sub.add_parser("grade-bench", help="评分的耗时：每个练习参考答案的评分延迟，可选与以前做法的对比和全班吞吐")
    b.add_argument("--json", action="store_true")
    b.add_argument("--scale", choices=("ci", "gpu"), default="ci")
    b.add_argument("--starters", action="store_true", help="同时给起始代码评分（应当不通过）")
    b.add_argument("--only", help="只评这些练习（逗号分隔的编号）")
    b.add_argument("--no-sandbox", action="store_true", help="不用操作系统沙箱（对比沙箱的开销）")
    b.add_argument("--compare", action="store_true",
                   help="同时按以前的做法（每次新起解释器、每次重测起始代码）评一次，打印两者之比")
    b.add_argument("--class-size", type=int, default=0, help="再用批量评分给 N 份参考答案的副本评分，打印全班吞吐")
    b.set_defaults(func=cmd_grade_bench)


__all__ = ["add_commands"]
if __name__ == "__main__":  # pragma: no cover
    sys.exit("用 `vramlab exercises|grade|grade-bench`")

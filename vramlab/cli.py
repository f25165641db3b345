"""`vramlab` command line. Human output is Chinese; `--json` prints one JSON object.

    vramlab estimate --model gpt2-small --batch 8 --seq 512 --optimizer adamw --precision fp32
    vramlab measure  --model tiny --batch 4 --seq 128 --backend sim [--fake] [--steps N] [--json]
    vramlab calibrate [--json]
    vramlab bench [--json]
    vramlab trace    --model tiny --batch 2 --seq 64 --out trace.json        (timeline for the website's viewer)
    vramlab trace    --from-cuda-snapshot snapshot.pickle --out trace.json
"""
from __future__ import annotations

import argparse
import json
import re
import sys

from .units import fmt_bytes, mib
from .workload import ATTENTION, CHECKPOINTING, OPTIMIZERS, PRECISIONS, Workload, WorkloadError

CATEGORY_ZH = {
    "parameters": "模型参数", "gradients": "梯度", "optimizer_state": "优化器状态", "activations": "激活值",
    "logits_and_loss": "logits 与损失", "temporaries": "临时张量", "cuda_overhead": "CUDA 开销（cuBLAS 工作区）",
    "other": "其他",
}


class CliError(Exception):
    """A user-facing failure: printed in Chinese, exit code 2, no traceback."""


class ChineseArgumentParser(argparse.ArgumentParser):
    _PATTERNS = [
        (r"argument command: invalid choice: '?([^' ]*)'? \(choose from (.*)\)", "未知子命令 {0!r}，可选：{1}"),
        (r"argument (\S+): invalid choice: '?([^' ]*)'? \(choose from (.*)\)", "参数 {0} 的取值 {1!r} 无效，可选：{2}"),
        (r"argument (\S+): invalid (int|float) value: '(.*)'", "参数 {0} 需要{1}，收到 {2!r}"),
        (r"argument (\S+): expected one argument", "参数 {0} 后面需要一个值"),
        (r"unrecognized arguments: (.*)", "无法识别的参数：{0}"),
        (r"the following arguments are required: (.*)", "缺少必需参数：{0}"),
    ]

    def error(self, message):
        for pattern, zh in self._PATTERNS:
            m = re.search(pattern, message)
            if m:
                groups = [{"int": "整数", "float": "数字"}.get(g, g) for g in m.groups()]
                message = zh.format(*groups)
                break
        self.print_usage(sys.stderr)
        print(f"错误：{message}（用 -h 查看帮助）", file=sys.stderr)
        sys.exit(2)


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"需要正整数，收到 {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"需要正整数，收到 {text!r}")
    return value


def _add_workload_flags(p):
    p.add_argument("--model", default="gpt2-small", help="模型预设（见 vramlab.models.PRESETS）")
    p.add_argument("--batch", type=_positive_int, default=8, help="micro-batch 大小")
    p.add_argument("--seq", type=_positive_int, default=512, help="序列长度")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--checkpointing", choices=CHECKPOINTING, default="none")
    p.add_argument("--attention", choices=ATTENTION, default="sdpa")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lora-rank", type=int, default=0)
    p.add_argument("--zero", type=int, default=0)
    p.add_argument("--gpus", type=_positive_int, default=1)
    p.add_argument("--accum", type=_positive_int, default=1, help="梯度累积步数")
    p.add_argument("--offload", choices=("none", "activations"), default="none",
                   help="activations：把反向要用的激活值存到主存（save_on_cpu）")
    p.add_argument("--inference", action="store_true", help="只做前向推理（inference_mode）")
    p.add_argument("--json", action="store_true", help="输出一个 JSON 对象")


def _workload(args) -> Workload:
    return Workload(model=args.model, batch=args.batch, seq=args.seq, optimizer=args.optimizer,
                    precision=args.precision, checkpointing=args.checkpointing, attention=args.attention,
                    dropout=args.dropout, lora_rank=args.lora_rank, zero=args.zero, gpus=args.gpus,
                    accum=args.accum, offload=args.offload, inference=args.inference).validate()


def _print_breakdown(title: str, total: int, breakdown: dict, notes: dict | None = None):
    print(title)
    width = max(len(CATEGORY_ZH.get(k, k)) for k in breakdown) + 2
    print(f"  {'类别':<{width}}{'显存':>12}  {'占比':>6}")
    for key, value in breakdown.items():
        share = f"{100 * value / total:5.1f}%" if total else "   -  "
        line = f"  {CATEGORY_ZH.get(key, key):<{width}}{fmt_bytes(value):>12}  {share}"
        if notes and notes.get(key):
            line += f"  {notes[key]}"
        print(line)
    print(f"  {'合计':<{width}}{fmt_bytes(total):>12}")


def cmd_estimate(args):
    from .estimate import estimate

    est = estimate(_workload(args))
    if args.json:
        print(json.dumps(est.to_dict(), ensure_ascii=False))
        return 0
    _print_breakdown(f"估算峰值显存（单卡，{args.model}，batch {args.batch}，seq {args.seq}）",
                     est.total_bytes, est.breakdown, est.notes)
    return 0


def cmd_measure(args):
    from .runner import measure_workload

    w = _workload(args)
    if args.backend == "sim" and not args.fake:
        from .models import get_preset
        if get_preset(w.model).fake_only:
            raise CliError(f"{w.model} 太大，不能在本机真实分配：请加 --fake（FakeTensorMode，只算形状不算数据）")
    m = measure_workload(w, backend=args.backend, fake=args.fake, steps=args.steps)
    if args.json:
        print(json.dumps(m.to_dict(), ensure_ascii=False))
        return 0
    where = "模拟设备" + ("（FakeTensorMode）" if m.fake else "") if m.backend == "sim" else "CUDA"
    print(f"测量结果（{where}，torch {m.torch_version}）")
    print(f"  稳态峰值（已分配）  {fmt_bytes(m.peak_bytes)}")
    print(f"  第一步峰值          {fmt_bytes(m.first_step_peak_bytes)}")
    print(f"  峰值（已保留）      {fmt_bytes(m.reserved_peak_bytes)}")
    print(f"  碎片（保留-分配）   {fmt_bytes(m.fragmentation_bytes)}")
    if m.step_ms is not None and not m.fake:
        print(f"  单步耗时            {m.step_ms:.1f} ms")
    if m.nvml_process_bytes:
        print(f"  NVML 进程显存       {fmt_bytes(m.nvml_process_bytes)}（含 CUDA 上下文）")
    if m.peak_where:
        print(f"  峰值出现在          {m.peak_where}")
    if m.breakdown:
        _print_breakdown("峰值时刻的显存构成：", m.peak_bytes, m.breakdown)
    return 0


def cmd_calibrate(args):
    from .calibrate import calibrate, print_report

    report = calibrate(backends=args.backends, rows=args.rows)
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        print_report(report)
    return 0


def cmd_bench(args):
    from .bench import run_bench

    run_bench(as_json=args.json)
    return 0


def cmd_trace(args):
    from pathlib import Path

    from .trace.__main__ import write

    if args.from_cuda_snapshot:
        from .trace.cuda import from_snapshot, load_snapshot
        trace = from_snapshot(load_snapshot(args.from_cuda_snapshot), device=args.device,
                              title=Path(args.from_cuda_snapshot).name)
    else:
        from .trace.sim import record_workload
        w = _workload(args)
        if w.zero or w.gpus > 1:
            raise CliError("trace 在单个进程里运行，不能模拟 --zero/--gpus")
        trace = record_workload(w, steps=args.steps, title=f"{w.model}，batch {w.batch}，seq {w.seq}")
    write(trace, Path(args.out))
    peak = trace["peak"]
    print(f"已写入 {args.out}：峰值 {fmt_bytes(peak['bytes'])}，出现在 {peak['op']} @ {peak['module']}。"
          f"在课程网站的“显存时间线”页面点“打开文件”即可查看。")
    return 0


def cmd_tutorials(args):
    from .tutorials import main as tutorials_main

    return tutorials_main([args.action] + (["--only", args.only] if args.only else []))


def build_parser():
    p = ChineseArgumentParser(prog="vramlab", description="显存优化实战：估算、测量与校准峰值显存")
    sub = p.add_subparsers(dest="command", required=True, parser_class=ChineseArgumentParser)
    e = sub.add_parser("estimate", help="解析式估算峰值显存")
    _add_workload_flags(e)
    e.set_defaults(func=cmd_estimate)
    m = sub.add_parser("measure", help="实际运行训练步并测量峰值显存")
    _add_workload_flags(m)
    m.add_argument("--backend", choices=("sim", "cuda", "auto"), default="sim")
    m.add_argument("--fake", action="store_true", help="在 FakeTensorMode 下运行：不分配真实内存")
    m.add_argument("--steps", type=_positive_int, default=2, help="预热 1 步后测量的步数")
    m.set_defaults(func=cmd_measure)
    c = sub.add_parser("calibrate", help="逐行对比 H200 参考表：模拟设备（及 GPU）")
    c.add_argument("--json", action="store_true")
    c.add_argument("--backends", default="auto", help="sim、cuda、sim,cuda 或 auto（有 GPU 时两者都测）")
    c.add_argument("--rows", default=None, help="只测这些行（逗号分隔的配置名）")
    c.set_defaults(func=cmd_calibrate)
    b = sub.add_parser("bench", help="基准：跟踪开销、模拟设备与 H200 的比值、FakeTensorMode 耗时")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bench)
    tr = sub.add_parser("trace", help="导出显存时间线（JSON），用网站的时间线查看器打开")
    _add_workload_flags(tr)
    tr.add_argument("--steps", type=_positive_int, default=2, help="记录的训练步数（含模型构建）")
    tr.add_argument("--from-cuda-snapshot", default=None, metavar="PICKLE",
                    help="改为转换 torch.cuda.memory._dump_snapshot() 保存的快照")
    tr.add_argument("--device", type=int, default=0, help="快照里的 GPU 序号")
    tr.add_argument("--out", required=True, help="输出的 JSON 文件")
    tr.set_defaults(func=cmd_trace)
    t = sub.add_parser("tutorials", help="执行全部教程（run）或检查网页上的输出是否过期（check）")
    t.add_argument("action", choices=("run", "check", "list"))
    t.add_argument("--only", default=None, help="只处理这些章节，如 ch01,ch02")
    t.set_defaults(func=cmd_tutorials)
    from .grader.cli import add_commands; add_commands(sub)  # noqa: E702
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (WorkloadError, CliError, ValueError, KeyError) as e:
        msg = e.args[0] if e.args else str(e)
        print(f"错误：{msg}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        if "out of memory" in str(e).lower():
            print(f"错误：显存不足——{e}", file=sys.stderr)
            return 3
        print(f"错误：运行失败：{e}", file=sys.stderr)
        return 1
    except MemoryError:
        print("错误：本机内存不够运行这个工作负载：请加 --fake 或换更小的 --model/--batch/--seq", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())

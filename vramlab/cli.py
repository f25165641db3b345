"""`vramlab` command line. Human output is Chinese; `--json` prints one JSON object.

    vramlab estimate --model gpt2-small --batch 8 --seq 512 --optimizer adamw --precision fp32
    vramlab measure  --model tiny --batch 4 --seq 128 --backend sim [--fake] [--steps N] [--json]
    vramlab calibrate [--json]
    vramlab bench [--json]
    vramlab trace    --model tiny --batch 2 --seq 64 --out trace.json        (timeline for the website's viewer)
    vramlab trace    --from-cuda-snapshot snapshot.pickle --out trace.json
    vramlab plan     --config path/to/config.json --card 24GiB [--gpus N] [--seq S] [--global-batch B]
    (estimate, measure and trace take --config PATH too: a local Hugging Face config.json instead of --model)

Every failure is a Chinese message on stderr, no traceback, and an exit code of its own
(vramlab/errors.py: 2 bad arguments, 3 unreadable submission, 4 the grader or this machine cannot
do it, 5 out of memory, 128+N a stop signal); with `--json`, one JSON error object on stdout too:
{"error": KIND, "message": ..., "exit_code": N}. Every parser here is a ChineseArgumentParser:
argparse's own words (usage, errors, help) are Chinese as well.
"""
from __future__ import annotations

import argparse
import json
import sys

from .errors import (EXIT_FAILED, EXIT_GRADER, EXIT_MEMORY, EXIT_USAGE, Interrupted, describe,
                     os_error_zh, signal_zh, stop_on_signals)
from . import vocab
from .args import ChineseArgumentParser, CliError, positive_int, report_error
from .display import pad, width as text_width      # CJK characters take two terminal columns
from .units import fmt_bytes, mib
from .workload import ATTENTION, CHECKPOINTING, LORA_TARGETS, OPTIMIZERS, PRECISIONS, Workload, WorkloadError

CATEGORY_ZH = vocab.labels(vocab.STEP_CATEGORIES)


# options of a training step: None unless given, so that --inference can refuse them (it ignores them)
TRAINING_ONLY = {"optimizer": "adamw", "checkpointing": "none", "lora_rank": 0, "zero": 0, "gpus": 1, "accum": 1,
                 "offload": "none", "dropout": 0.0, "lora_targets": "default", "qlora": False}


def _add_workload_flags(p):
    p.add_argument("--model", default="gpt2-small", help="模型预设（见 vramlab.models.PRESETS）")
    p.add_argument("--config", default=None, metavar="PATH",
                   help="本地 Hugging Face config.json（或存放它的文件夹）；给出时代替 --model，不联网")
    p.add_argument("--batch", type=positive_int, default=8, help="micro-batch 大小")
    p.add_argument("--seq", type=positive_int, default=512, help="序列长度")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=None, help="优化器（默认 adamw）")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--checkpointing", choices=CHECKPOINTING, default=None, help="激活检查点（默认 none）")
    p.add_argument("--attention", choices=ATTENTION, default="sdpa")
    p.add_argument("--dropout", type=float, default=None, help="dropout 概率（默认 0）")
    p.add_argument("--lora-rank", type=int, default=None, help="LoRA 的秩（默认 0：不用 LoRA）")
    p.add_argument("--lora-targets", choices=LORA_TARGETS, default=None,
                   help="LoRA 的目标模块：default（peft 默认：GPT-2 c_attn，BERT query/value，Llama 式 q_proj/v_proj）、"
                        "qkvo（注意力的四个投影）、all-linear（全部线性层，输出层除外）")
    p.add_argument("--qlora", action="store_const", const=True, default=None,
                   help="QLoRA：基座的线性层用 NF4（bitsandbytes），其余参数按 prepare_model_for_kbit_training 升为 FP32；"
                        "需要 --lora-rank")
    p.add_argument("--zero", type=int, default=None, help="ZeRO 阶段 0/1/2/3（默认 0）")
    p.add_argument("--gpus", type=positive_int, default=None, help="数据并行的卡数（默认 1）")
    p.add_argument("--accum", type=positive_int, default=None, help="梯度累积步数（默认 1）")
    p.add_argument("--offload", choices=("none", "activations"), default=None,
                   help="activations：把反向要用的激活值存到主存（save_on_cpu）")
    p.add_argument("--inference", action="store_true", help="只做前向推理（inference_mode）；不能与训练选项同用")
    p.add_argument("--json", action="store_true", help="输出一个 JSON 对象")


def _workload(args) -> Workload:
    if getattr(args, "config", None):            # a local config.json becomes preset cfg:<name>
        from .hfconfig import load_config
        args.model = load_config(args.config).name
    given = [name for name in TRAINING_ONLY if getattr(args, name, None) is not None]
    if args.inference and given:
        flags = "、".join("--" + name.replace("_", "-") for name in given)
        raise CliError(f"--inference 只做前向推理，不用 {flags}（它们只影响训练步）：去掉这些参数，或去掉 --inference")
    train = {name: TRAINING_ONLY[name] if getattr(args, name, None) is None else getattr(args, name)
             for name in TRAINING_ONLY}
    return Workload(model=args.model, batch=args.batch, seq=args.seq, precision=args.precision,
                    attention=args.attention, inference=args.inference, **train).validate()


def _print_breakdown(title: str, total: int, breakdown: dict, notes: dict | None = None):
    print(title)
    width = max(text_width(CATEGORY_ZH.get(k, k)) for k in breakdown) + 2
    print(f"  {pad('类别', width)}{'显存':>10}  {'占比':>4}")
    for key, value in breakdown.items():
        share = f"{100 * value / total:5.1f}%" if total else "   -  "
        line = f"  {pad(CATEGORY_ZH.get(key, key), width)}{fmt_bytes(value):>12}  {share}"
        if notes and notes.get(key):
            line += f"  {notes[key]}"
        print(line)
    print(f"  {pad('合计', width)}{fmt_bytes(total):>12}")


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
    if args.backend == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise _no_gpu("--backend cuda")
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
    # The three figures come from different moments: each peak is the largest value over the
    # measured steps (reached at different instants), the fragmentation is read after the last one.
    rows = (("稳态峰值（已分配，测量步中最大的时刻）", m.peak_bytes),
            ("第一步峰值（已分配）", m.first_step_peak_bytes),
            ("已保留的峰值（测量步中最大的时刻，与已分配峰值不一定同时）", m.reserved_peak_bytes),
            ("碎片（测量结束时的 已保留 − 已分配）", m.fragmentation_bytes))
    width = max(text_width(label) for label, _ in rows) + 2
    for label, value in rows:
        print(f"  {pad(label, width)}{fmt_bytes(value):>12}")
    if m.step_ms is not None and not m.fake:
        print(f"  单步耗时            {m.step_ms:.1f} ms")
    if m.nvml_process_bytes:
        print(f"  NVML 进程显存       {fmt_bytes(m.nvml_process_bytes)}（含 CUDA 上下文）")
    if m.peak_where:
        print(f"  峰值出现在          {m.peak_where}")
    if m.breakdown:
        _print_breakdown("峰值时刻的显存构成：", m.peak_bytes, m.breakdown)
    return 0


def _no_gpu(flag: str) -> CliError:
    return CliError(f"这台机器上没有可用的 GPU（torch.cuda.is_available() 为 False）：{flag} 需要 NVIDIA GPU 和 CUDA 版的 "
                    "PyTorch；没有 GPU 时用 sim（模拟设备）", EXIT_GRADER)


def cmd_calibrate(args):
    from .calibrate import calibrate, print_report
    from .reference import reference_rows

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.backends != "auto" and (not backends or any(b not in ("sim", "cuda") for b in backends)):
        raise CliError(f"--backends 只能是 sim、cuda、sim,cuda 或 auto，收到 {args.backends!r}")
    if "cuda" in backends:
        import torch

        if not torch.cuda.is_available():
            raise _no_gpu("--backends cuda")
    if args.rows is not None:
        known = [r.name for r in reference_rows()]
        wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
        unknown = [r for r in wanted if r not in known]
        if unknown or not wanted:
            raise CliError(f"--rows 里有未知的配置名：{', '.join(unknown) or '（空）'}；可选：{', '.join(known)}")
    report = calibrate(backends=args.backends if args.backends == "auto" else ",".join(backends), rows=args.rows)
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        print_report(report)
    return 0


def cmd_bench(args):
    from .bench import run_bench

    run_bench(as_json=args.json)
    return 0


def _check_out(path) -> None:
    """Refuse an --out that cannot be written, before any work: a folder, a missing folder."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise CliError(f"--out {p} 是一个文件夹：请给出一个文件名，例如 {p / 'trace.json'}")
    if not p.parent.is_dir():
        raise CliError(f"--out 的文件夹 {p.parent} 不存在：请先创建它，或换一个路径")


def _load_snapshot(path) -> dict:
    import pickle

    from .trace.cuda import load_snapshot

    try:
        snap = load_snapshot(path)
    except OSError as e:
        raise CliError(f"无法读取快照 {os_error_zh(e)}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError, IndexError, KeyError) as e:
        raise CliError(f"{path} 不是 torch.cuda.memory._dump_snapshot() 保存的快照（无法按 pickle 读取）") from None
    if not isinstance(snap, dict) or "segments" not in snap:
        raise CliError(f"{path} 不是 torch.cuda.memory._dump_snapshot() 保存的快照（缺少 segments）")
    return snap


def cmd_trace(args):
    from pathlib import Path

    from .trace.__main__ import write

    _check_out(args.out)
    if args.from_cuda_snapshot:
        from .trace.cuda import from_snapshot
        try:
            trace = from_snapshot(_load_snapshot(args.from_cuda_snapshot), device=args.device,
                                  title=Path(args.from_cuda_snapshot).name)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise CliError(f"快照 {args.from_cuda_snapshot} 的内容不完整，无法转换（{describe(e)}）") from None
    else:
        from .trace.sim import record_workload
        w = _workload(args)
        if w.zero or w.gpus > 1:
            raise CliError("trace 在单个进程里运行，不能模拟 --zero/--gpus")
        trace = record_workload(w, steps=args.steps, title=f"{w.model}，batch {w.batch}，seq {w.seq}")
    try:
        write(trace, Path(args.out))
    except OSError as e:
        raise CliError(f"无法写入 {os_error_zh(e)}", EXIT_FAILED) from None
    peak = trace["peak"]
    print(f"已写入 {args.out}：峰值 {fmt_bytes(peak['bytes'])}，出现在 {peak['op']} @ {peak['module']}。"
          f"在课程网站的“显存时间线”页面点“打开文件”即可查看。")
    return 0


def cmd_plan(args):
    from .plan import run

    return run(args)


def cmd_tutorials(args):
    from .tutorials import main as tutorials_main

    return tutorials_main([args.action] + (["--only", args.only] if args.only is not None else [])
                          + (["--jobs", str(args.jobs)] if args.jobs is not None else [])
                          + (["--stale"] if args.stale else []))


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
    m.add_argument("--steps", type=positive_int, default=2, help="预热 1 步后测量的步数")
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
    tr.add_argument("--steps", type=positive_int, default=2, help="记录的训练步数（含模型构建）")
    tr.add_argument("--from-cuda-snapshot", default=None, metavar="PICKLE",
                    help="改为转换 torch.cuda.memory._dump_snapshot() 保存的快照")
    tr.add_argument("--device", type=int, default=0, help="快照里的 GPU 序号")
    tr.add_argument("--out", required=True, help="输出的 JSON 文件")
    tr.set_defaults(func=cmd_trace)
    pl = sub.add_parser("plan", help="在给定显卡上规划微调：搜索装得下的组合，按步时排序，并在模拟设备上验证")
    from .plan import add_arguments as _plan_arguments; _plan_arguments(pl)  # noqa: E702
    pl.set_defaults(func=cmd_plan)
    ev = sub.add_parser("evidence", add_help=False,
                        help="一条命令收集证据：校准、评每道练习的参考答案和起始代码、执行教程（GPU 上用 scripts/gpu_evidence.sh）")
    ev.add_argument("rest", nargs=argparse.REMAINDER)     # vramlab/evidence.py parses (and explains) its own options
    ev.set_defaults(func=lambda args: __import__("vramlab.evidence", fromlist=["main"]).main(args.rest))
    t = sub.add_parser("tutorials", help="执行全部教程（run）或检查网页上的输出是否过期（check）")
    t.add_argument("action", choices=("run", "check", "list"))
    t.add_argument("--only", default=None, help="只处理这些章节，如 ch01,ch02")
    t.add_argument("--jobs", type=positive_int, default=None, help="同时执行几份教程（默认每个 CPU 核一份，最多 4）")
    t.add_argument("--stale", action="store_true", help="run 时只执行输出已过期的教程")
    t.set_defaults(func=cmd_tutorials)
    from .grader.cli import add_commands; add_commands(sub)  # noqa: E702
    return p


# Subcommands with a parser of their own, in the module whose build_parser() and main() they use:
# evidence (options before the folder, -h, --help) and grade-class (the batch's options and Slurm's).
OWN_PARSER = {"evidence": "vramlab.evidence", "grade-class": "vramlab.grader.slurm"}


def _own_module(argv: list[str]):
    import importlib

    return importlib.import_module(OWN_PARSER[argv[0]]) if argv[:1] and argv[0] in OWN_PARSER else None


def parser_for(argv: list[str]):
    """The parser that reads `vramlab ARGV`, and the arguments it reads: a subcommand in OWN_PARSER
    has its module's (main hands it over); every other one is build_parser()'s. The docs' commands
    are checked through it (tests/test_readme.py)."""
    own = _own_module(argv)
    return (own.build_parser(), argv[1:]) if own else (build_parser(), argv)


def main(argv=None) -> int:
    """Run one subcommand. Stop signals (Ctrl-C, SIGTERM, SIGHUP) end it cleanly: the gradings'
    processes are killed and their folders removed, a Chinese line says so, exit 128+N."""
    argv = sys.argv[1:] if argv is None else list(argv)
    own = _own_module(argv)
    if own:
        return own.main(argv[1:])
    with stop_on_signals():
        try:
            args = build_parser().parse_args(argv)
        except Interrupted as e:
            print(f"已中断（{signal_zh(e.signum)}）。", file=sys.stderr)
            return e.exit_code
        as_json = bool(getattr(args, "json", False))
        try:
            return args.func(args)
        except Interrupted as e:
            return _interrupted(e, as_json)
        except CliError as e:
            return report_error(str(e), e.code, as_json)
        except (WorkloadError, ValueError, KeyError) as e:
            return report_error(describe(e), EXIT_USAGE, as_json)
        except MemoryError:
            return report_error("本机内存不够运行这个工作负载：请加 --fake 或换更小的 --model/--batch/--seq", EXIT_MEMORY, as_json)
        except OSError as e:
            return report_error(f"运行失败：{os_error_zh(e)}", EXIT_FAILED, as_json)
        except RuntimeError as e:
            from .grader.core import GraderError

            if isinstance(e, GraderError):
                return report_error(str(e), EXIT_GRADER, as_json)
            if "out of memory" in str(e).lower():
                return report_error(f"显存不足——{e}", EXIT_MEMORY, as_json)
            return report_error(f"运行失败：{e}", EXIT_FAILED, as_json)


def _interrupted(e: Interrupted, as_json: bool) -> int:
    """Kill what the command started (the gradings' children, in their own sessions), wait until
    their folders are gone, then say so."""
    import sys as _sys

    sandbox = _sys.modules.get("vramlab.grader.sandbox")
    done = ""
    if sandbox is not None:              # a grading command: say what became of its processes
        sandbox.abort_all()
        left = sandbox.active_runs()
        done = f"，还有 {left} 个评分进程在收尾" if left else "，评分进程已结束，临时文件已删除"
    message = f"已中断（{signal_zh(e.signum)}）{done}：没有给出结果。"
    print(message, file=sys.stderr)
    if as_json:
        print(json.dumps({"error": "interrupted", "message": message, "exit_code": e.exit_code}, ensure_ascii=False))
    return e.exit_code


if __name__ == "__main__":
    sys.exit(main())

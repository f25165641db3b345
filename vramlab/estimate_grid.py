"""The estimator against the simulated device over every option it offers.

    python -m vramlab.estimate_grid                  # full-size sample configs, FakeTensorMode
    python -m vramlab.estimate_grid --twins          # the small twins the test suite uses
    python -m vramlab.estimate_grid --limit 40 --json
    python -m vramlab.estimate_grid --limit 40 --record   # append the summary to the performance history

One *case* is a choice on every axis: precision × method (full fine-tuning, LoRA with its target
modules, QLoRA) × activation checkpointing × optimizer × activation offload × accumulation ×
attention kernel × dropout, on a model, in a *regime*:

    states       micro-batch 1, sequence 64: weights, gradients and optimizer state dominate
    activations  micro-batch 4, the longest sequence the model takes up to 2048, a vocabulary
                 cut to 8,192 words: saved activations dominate

For each case `vramlab.estimate` is compared with the steady-state peak the simulated device
measures under FakeTensorMode (what `vramlab measure --backend sim --fake` prints; QLoRA with
the NF4 stand-in of `vramlab.sim.nf4`, as `vramlab plan` checks it). ZeRO is not on the grid: the
simulated device runs one process, and ZeRO needs two or more.

The full product of the axes is ~10⁵ cases per model, so the grid is sampled, deterministically:
every *pair* of option values on any two axes occurs in at least one case (a pairwise covering
array, built greedily), and every *triple* of precision, method, checkpointing and optimizer too
(they decide which tensors exist and in what dtype), and of regime, attention, offload and
checkpointing (they decide which moment of the step is the peak). Combinations a model cannot run
are left out and named in `EXCLUDED`.

Models: the sample configs of vramlab/data/configs (GPT-2 medium, BERT-base, Llama-3.1-8B,
Mistral-7B, Qwen2.5-7B, Mixtral-8x7B) and a tied-head Qwen2.5 (as Qwen2.5-0.5B-3B ship), each
either full size (this command) or as a *twin*: the same widths, heads, vocabulary and head
tying with 2 layers, which the simulated device runs in a fraction of a second
(tests/test_estimate_grid.py).
"""
from __future__ import annotations

import itertools
import json
import sys
import time
from dataclasses import asdict, dataclass, fields, replace

from .workload import CHECKPOINTING, OFFLOAD, OPTIMIZERS, PRECISIONS, Workload

TOLERANCE = 0.03
MODELS = ("gpt2-medium", "bert-base-uncased", "llama-3.1-8b", "mistral-7b-v0.1", "qwen2.5-7b", "qwen2.5-tied",
          "mixtral-8x7b-v0.1")
METHODS = ("full", "lora", "lora-qkvo", "lora-all-linear", "qlora", "qlora-all-linear")
AXES = {
    "model": MODELS,
    "regime": ("states", "activations"),
    "precision": PRECISIONS,
    "method": METHODS,
    "checkpointing": CHECKPOINTING,
    "optimizer": OPTIMIZERS,
    "offload": OFFLOAD,
    "accum": (1, 2),
    "attention": ("sdpa", "eager"),
    "dropout": (0.0, 0.1),
    "foreach": (True, False),
}
# covered three at a time: what decides which tensors exist and in what dtype, and what decides
# which moment of the step is the peak
TRIPLES = (("precision", "method", "checkpointing", "optimizer"),
           ("regime", "attention", "offload", "checkpointing"))
LORA_RANK = 16
EXCLUDED = {
    "mixtral 只测纯 BF16": "transformers 的 MoE 专家默认走 grouped_mm，FakeTensorMode 下它只接受 BF16 权重",
    "mixtral 不测 QLoRA": "专家权重是 3 维张量，模拟设备的 NF4 替身只替换线性层",
}


@dataclass(frozen=True)
class Case:
    model: str
    regime: str
    precision: str
    method: str
    checkpointing: str
    optimizer: str
    offload: str
    accum: int
    attention: str
    dropout: float
    foreach: bool = True

    @property
    def qlora(self) -> bool:
        return self.method.startswith("qlora")

    @property
    def lora_targets(self) -> str:
        return "default" if self.method in ("full", "lora", "qlora") else self.method.split("-", 1)[1]

    def label(self) -> str:
        return " ".join(f"{v}" for v in asdict(self).values())


def feasible(a: dict) -> bool:
    """Can the simulated device run a (partial) assignment? See EXCLUDED."""
    if a.get("model", "").startswith("mixtral"):
        if "precision" in a and a["precision"] != "bf16":
            return False
        if "method" in a and a["method"].startswith("qlora"):
            return False
    return True


def covering_cases(axes: dict = AXES, triples=TRIPLES, candidates: int = 24, seed: int = 30) -> list[Case]:
    """A deterministic covering array: every feasible pair of values of any two axes, and every
    feasible triple within each group of `triples`, appears in at least one case. Built greedily
    as AETG does (Cohen et al. 1997): each new case is the best of `candidates` rows, each started
    from the first uncovered tuple and completed axis by axis, in a shuffled order, with the value
    that covers the most uncovered tuples (ties: a shuffled order). The shuffles come from a
    seeded generator, so the grid is the same on every run."""
    import random

    rng = random.Random(seed)
    names = list(axes)
    wanted = set()
    for combo in itertools.combinations(names, 2):
        wanted |= _feasible_tuples(axes, combo)
    for group in triples:
        for combo in itertools.combinations(group, 3):
            wanted |= _feasible_tuples(axes, combo)
    order = {n: i for i, n in enumerate(names)}
    uncovered = sorted(wanted, key=lambda t: ([order[n] for n, _ in t], [axes[n].index(v) for n, v in t]))
    left = set(uncovered)
    cases = []
    while left:
        seed_tuple = next(t for t in uncovered if t in left)
        best, best_gain = None, -1
        for _ in range(candidates):
            row = dict(seed_tuple)
            rest = [n for n in names if n not in row]
            rng.shuffle(rest)
            for n in rest:
                values = list(axes[n])
                rng.shuffle(values)
                pick, pick_gain = None, -1
                for v in values:
                    trial = {**row, n: v}
                    if not feasible(trial):
                        continue
                    gain = sum(1 for t in _tuples_with(trial, n, triples) if t in left)
                    if gain > pick_gain:
                        pick, pick_gain = v, gain
                row[n] = pick
            gain = sum(1 for t in _tuples_with(row, None, triples) if t in left)
            if gain > best_gain:
                best, best_gain = row, gain
        for t in _tuples_with(best, None, triples):
            left.discard(t)
        cases.append(Case(**{n: best[n] for n in names}))
    return cases


def _feasible_tuples(axes, combo) -> set:
    out = set()
    for values in itertools.product(*(axes[n] for n in combo)):
        t = tuple(zip(combo, values))
        if feasible(dict(t)):
            out.add(t)
    return out


def _tuples_with(row: dict, axis: str | None, triples) -> list[tuple]:
    """The pairs (and triples) that `row` covers, those containing `axis` if given."""
    names = [n for n in AXES if n in row]
    out = []
    for a, b in itertools.combinations(names, 2):
        if axis is None or axis in (a, b):
            out.append(((a, row[a]), (b, row[b])))
    for group in triples:
        cn = [n for n in group if n in row]
        for combo in itertools.combinations(cn, 3):
            if axis is None or axis in combo:
                out.append(tuple((n, row[n]) for n in combo))
    return out


# ---------------------------------------------------------------------------------------------
# Models: sample configs, full size or as 2-layer twins
# ---------------------------------------------------------------------------------------------

def model_config(model: str, regime: str, twin: bool) -> dict:
    from .hfconfig import CONFIG_DIR, read_config

    stem = "qwen2.5-7b" if model == "qwen2.5-tied" else model
    cfg, _ = read_config(CONFIG_DIR / f"{stem}.json")
    cfg = dict(cfg)
    if model == "qwen2.5-tied":
        cfg["tie_word_embeddings"] = True
    if twin:
        cfg["n_layer" if cfg.get("model_type") == "gpt2" else "num_hidden_layers"] = 2
    if regime == "activations":
        cfg["vocab_size"] = min(cfg["vocab_size"], 8192)
    return cfg


def preset_name(model: str, regime: str, twin: bool) -> str:
    from .hfconfig import load_config_dict

    tag = f"{'twin' if twin else 'full'}-{model}-{'v8k' if regime == 'activations' else 'v'}"
    return load_config_dict(model_config(model, regime, twin), tag).name


def workload(case: Case, twin: bool = True) -> Workload:
    from .models import get_preset

    name = preset_name(case.model, case.regime, twin)
    p = get_preset(name)
    max_pos = p.config.get("n_positions", p.config.get("max_position_embeddings"))
    batch, seq = (1, 64) if case.regime == "states" else (4, min(2048, max_pos))
    extra = {}
    if "lora_targets" in {f.name for f in fields(Workload)}:
        extra["lora_targets"] = case.lora_targets
        if "qlora" in {f.name for f in fields(Workload)}:
            extra["qlora"] = case.qlora
    w = Workload(model=name, batch=batch, seq=seq, precision=case.precision, optimizer=case.optimizer,
                 checkpointing=case.checkpointing, offload=case.offload, accum=case.accum,
                 attention=case.attention, dropout=case.dropout, foreach=case.foreach,
                 lora_rank=0 if case.method == "full" else LORA_RANK, **extra)
    return w.validate()


def supported(case: Case) -> bool:
    """False for options this checkout's Workload cannot express (LoRA targets other than peft's
    default, before vramlab had them)."""
    has_targets = "lora_targets" in {f.name for f in fields(Workload)}
    return has_targets or case.lora_targets == "default"


def estimate_bytes(case: Case, twin: bool = True) -> int:
    from .estimate import estimate

    w = workload(case, twin)
    if "qlora" in {f.name for f in fields(Workload)}:
        return estimate(w, device="sim").total_bytes
    return estimate(w, qlora=case.qlora).total_bytes


def measure_bytes(case: Case, twin: bool = True) -> int:
    """Steady-state peak allocated on SimDevice(fake=True): 1 warm-up step, then 1 measured."""
    from .meter import measure_steps, open_device
    from .runner import build_training

    w = workload(case, twin)
    with open_device("sim", fake=True, timeline=False) as dev:       # QLoRA: runner builds the NF4 stand-in
        _model, _opt, step = build_training(w, dev)
        return int(measure_steps(step, dev, warmup=1, steps=1).peak_bytes)


def run(cases, twin: bool = True, progress=None) -> list[dict]:
    rows = []
    for i, case in enumerate(cases):
        if not supported(case):
            rows.append({**asdict(case), "status": "unsupported"})
            continue
        t0 = time.perf_counter()
        try:
            est = estimate_bytes(case, twin)
            sim = measure_bytes(case, twin)
        except Exception as e:      # reported per case: the grid goes on
            rows.append({**asdict(case), "status": "error", "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        rows.append({**asdict(case), "status": "ok", "estimate_bytes": est, "sim_bytes": sim,
                     "error_rel": est / sim - 1, "seconds": round(time.perf_counter() - t0, 2)})
        if progress:
            progress(i + 1, len(cases), rows[-1])
    return rows


def worst_per_option(rows: list[dict]) -> dict:
    """axis -> value -> (worst signed relative error, case count, count within TOLERANCE)."""
    out: dict = {}
    for axis in AXES:
        for r in rows:
            if r["status"] != "ok":
                continue
            slot = out.setdefault(axis, {}).setdefault(str(r[axis]), [0.0, 0, 0])
            if abs(r["error_rel"]) > abs(slot[0]):
                slot[0] = r["error_rel"]
            slot[1] += 1
            slot[2] += abs(r["error_rel"]) <= TOLERANCE
    return out


def _pad(text: str, width: int) -> str:
    import unicodedata

    cols = sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
    return text + " " * max(0, width - cols)


def report(rows: list[dict], out=None) -> None:
    import torch

    out = out or sys.stdout
    ok = [r for r in rows if r["status"] == "ok"]
    within = sum(abs(r["error_rel"]) <= TOLERANCE for r in ok)
    print(f"估算 vs 模拟设备（FakeTensorMode，torch {torch.__version__}）：{len(rows)} 种组合，"
          f"{within}/{len(ok)} 在 ±{TOLERANCE:.0%} 以内", file=out)
    for status, zh in (("error", "运行出错"), ("unsupported", "本版本不支持")):
        n = sum(r["status"] == status for r in rows)
        if n:
            print(f"  {zh}：{n} 种", file=out)
    print("\n各选项的最大偏差（估算/模拟 − 1；组合数；其中在容差内的）：", file=out)
    for axis, values in worst_per_option(rows).items():
        cells = "  ".join(f"{v} {100 * e:+.1f}%（{n}，{k}）" for v, (e, n, k) in values.items())
        print(f"  {_pad(axis, 14)}{cells}", file=out)
    bad = sorted((r for r in ok if abs(r["error_rel"]) > TOLERANCE), key=lambda r: -abs(r["error_rel"]))
    if bad:
        print(f"\n超出容差的组合（{len(bad)} 种，按偏差排序，最多列 30 种）：", file=out)
        for r in bad[:30]:
            case = Case(**{k: r[k] for k in AXES})
            print(f"  {100 * r['error_rel']:+6.1f}%  估算 {r['estimate_bytes'] / 2**20:9,.0f} MiB  模拟 "
                  f"{r['sim_bytes'] / 2**20:9,.0f} MiB  {case.label()}", file=out)
    for r in rows:
        if r["status"] == "error":
            print(f"  出错：{Case(**{k: r[k] for k in AXES}).label()}：{r['error']}", file=out)


def record_figures(rows: list[dict], twin: bool) -> dict:
    """The history entry's figures (vramlab.perf): cases, how many within TOLERANCE, the worst
    error overall and, per axis, the worst of each option."""
    ok = [r for r in rows if r["status"] == "ok"]
    worst = worst_per_option(rows)
    figures = {"模型": "2 层双胞胎" if twin else "完整示例配置", "后端": "sim (FakeTensorMode)", "组合": len(rows),
               f"±{TOLERANCE:.0%} 以内": sum(abs(r["error_rel"]) <= TOLERANCE for r in ok),
               "最大偏差": f"{100 * max((r['error_rel'] for r in ok), key=abs, default=0.0):+.1f}%"}
    for n in ("error", "unsupported"):
        if any(r["status"] == n for r in rows):
            figures["出错" if n == "error" else "不支持"] = sum(r["status"] == n for r in rows)
    for axis, values in worst.items():
        figures[axis] = " / ".join(f"{v} {100 * e:+.1f}%" for v, (e, _n, _k) in values.items())
    return figures


def main(argv=None) -> int:
    import argparse

    from .args import ChineseArgumentParser

    parser = ChineseArgumentParser(
        prog="python -m vramlab.estimate_grid",
        description="在整个选项网格上比较估算器与模拟设备（FakeTensorMode）：精度 × 方法（全参数、LoRA 及其目标模块、"
                    "QLoRA）× 激活检查点 × 优化器 × 激活值卸载 × 梯度累积 × 注意力实现 × dropout，两种工况（批 1 短序列："
                    "权重、梯度、优化器状态为主；长序列：激活值为主）。网格按成对覆盖（再加精度、方法、检查点、优化器的"
                    "三元覆盖）确定性地抽样。默认用 vramlab/data/configs/ 里的完整示例配置，打印每个选项的最大偏差。")
    parser.add_argument("--twins", action="store_true", help="改用 2 层的“双胞胎”模型（与测试相同，快得多）")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="只跑抽样出的前 N 种组合")
    parser.add_argument("--model", default=None, help="只跑这个模型（例如 llama-3.1-8b）；可选：" + "、".join(MODELS))
    parser.add_argument("--json", action="store_true", help="输出一个 JSON 对象（每种组合一行数据）")
    parser.add_argument("--record", action="store_true",
                        help="把这次的结果（组合数、容差内的个数、各选项的最大偏差）追加到 vramlab/data/perf/history.jsonl")
    args = parser.parse_args(argv)
    cases = covering_cases()
    if args.model:
        if args.model not in MODELS:
            parser.error(f"未知模型 {args.model!r}；可选：{'、'.join(MODELS)}")
        cases = [c for c in cases if c.model == args.model]
    if args.limit:
        cases = cases[:args.limit]

    def progress(i, n, r):      # on stderr: a long run shows where it is even with --json
        print(f"\r{i}/{n} {r['model']} {100 * r['error_rel']:+.1f}%   ", end="", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    rows = run(cases, twin=args.twins, progress=progress)
    seconds = time.perf_counter() - t0
    print(file=sys.stderr)
    if args.record:
        from .perf import record

        command = "python -m vramlab.estimate_grid" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
        record("estimate-grid", command, record_figures(rows, args.twins),
               note=f"耗时 {seconds / 60:.0f} 分钟；偏差 = 估算 / 模拟设备的稳态已分配峰值 − 1")
    if args.json:
        print(json.dumps({"rows": rows, "worst_per_option": worst_per_option(rows), "tolerance": TOLERANCE,
                          "twins": args.twins, "seconds": round(seconds, 1)}, ensure_ascii=False))
    else:
        report(rows)
        print(f"\n耗时 {seconds:.0f} 秒（{'2 层双胞胎' if args.twins else '完整示例配置'}）")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Regenerate the traces the website's timeline viewer ships: `python -m vramlab.trace`.

Each is a row of the H200 reference table (vramlab/data/h200_gpt2_peaks.md) that a tutorial
measures, run for 2 steps on the simulated device under FakeTensorMode (about a minute in all).
Writes docs/assets/traces/<name>.json and index.json (the list the page offers).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "docs" / "assets" / "traces"

SITE_TRACES = [
    ("baseline", "small_fp32_adamw_b8_s512", "基准训练步：GPT-2 small，FP32 + AdamW，batch 8，seq 512",
     "第 1 章的基准配置。峰值出现在反向开始：logits 的梯度与 log_softmax 的输出同时存在。"),
    ("autocast", "small_bf16autocast_adamw_b8_s512", "BF16 混合精度（autocast）：GPT-2 small，batch 8，seq 512",
     "第 6 章：权重仍是 FP32，矩阵乘在 BF16 下计算；autocast 缓存的 16 位权重副本在前向里出现。"),
    ("checkpointing", "small_fp32_adamw_b8_s512_ckpt", "激活检查点：GPT-2 small，FP32 + AdamW，batch 8，seq 512",
     "第 7 章：每层只保留输入，反向时逐层重算；激活值那一层明显变薄。"),
]


def write(trace: dict, path: Path) -> None:
    path.write_text(json.dumps(trace, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")


def main(argv=None) -> int:
    from ..workload import from_reference_name
    from .sim import record_workload

    OUT.mkdir(parents=True, exist_ok=True)
    index = []
    for name, row, title, description in SITE_TRACES:
        trace = record_workload(from_reference_name(row), steps=2, title=title, description=description)
        trace["source"]["reference_row"] = row
        write(trace, OUT / f"{name}.json")
        index.append({"name": name, "title": title, "file": f"{name}.json"})
        print(f"已写入 {OUT / (name + '.json')}（峰值 {trace['peak']['bytes'] / 2**20:,.0f} MiB）")
    (OUT / "index.json").write_text(json.dumps(index, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

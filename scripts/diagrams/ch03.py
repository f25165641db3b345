"""Ch03: loading a sharded checkpoint into a meta-device model, shard by shard, across disk / host / device.

Numbers are the chapter's (gpt2-mini, BF16, max_shard_size="20MB"): 3 shards, the first holds only wte
(49.1 MiB), 74.1 MiB of weights in all; device peak 75.1 MiB (1.01x the weights) on the simulated device
(torch 2.13.0+cpu, 2026-11-29). The two peak formulas are the chapter's.
"""
from diagrams.svg import MUTED, Figure

TOTAL, FIRST, N_SHARDS, DEVICE_PEAK = 74.1, 49.1, 3, 75.1     # MiB


def draw():
    W, H, x0 = 800, 320, 110
    f = Figure("ch03-shard-loading", "逐片加载分片检查点：主存只放当前一片，显存里只有最终权重",
               "索引文件告诉加载器每个张量在哪一片；模型先在 meta 设备上只搭骨架，然后一片一片地映射进主存、搬上显卡、用 assign=True 换进模型。"
               f"于是主存峰值约等于最大的一片（gpt2-mini 的第一片只有词嵌入，{FIRST} MiB），显存峰值约等于最终的 BF16 权重（{TOTAL} MiB）。", W, H)
    for name, y, h in [("磁盘", 12, 74), ("主存（CPU）", 96, 84), ("显存（GPU）", 190, 118)]:
        f.rect(10, y, W - 20, h - 6, "idle", rx=6)
        f.text(18, y + 20, name, anchor="start", bold=True)
    f.box(x0, 28, 166, 46, "index.json", "neutral", sub="weight_map：张量 → 分片", size=14)
    sx = x0 + 184
    subs = [f"只有 wte：{FIRST} MiB"] + ["其余张量"] * (N_SHARDS - 1)
    for k, sub in enumerate(subs):
        f.box(sx + k * 150, 28, 140, 46, f"分片 {k + 1}", "free", sub=sub, size=14)
    f.text(18, 62, f"共 {TOTAL} MiB", anchor="start", size=12, color=MUTED)
    f.box(sx, 114, 210, 50, "load_file(分片 k)", "host", sub="映射这一片；用完 del，页可回收", size=14)
    f.arrow(sx + 70, 76, sx + 70, 112)
    f.text(sx + 230, 136, "主存峰值 ≈ 最大的一片", anchor="start", bold=True)
    f.text(sx + 230, 156, f"（这里是第一片 {FIRST} MiB）", anchor="start", size=12, color=MUTED)
    f.box(x0, 214, 190, 50, "meta 骨架", "neutral", sub="只有形状，不占显存", size=14)
    f.box(sx + 60, 214, 250, 50, ".to(device, bfloat16) 逐个张量", "param", sub="load_state_dict(part, assign=True)", size=14)
    f.arrow(sx + 105, 166, sx + 105, 212)
    f.arrow(sx + 58, 239, x0 + 192, 239)
    f.text(x0, 288, f"显存峰值 ≈ 最终权重：{DEVICE_PEAK} MiB，是 BF16 权重 {TOTAL} MiB 的 {DEVICE_PEAK / TOTAL:.2f} 倍",
           anchor="start", bold=True)
    f.text(W - 20, 300, "模拟设备，torch 2.13.0+cpu，2026-11-29", anchor="end", size=12, color=MUTED)
    return [f]

"""Ch04: where a batch lives on its way from disk to the GPU (disk / host memory / device memory lanes).

Only the last step touches device memory: one batch of B*T int64 tokens (8*B*T bytes, B=8, T=512 -> 32 KiB,
the chapter's arithmetic). The dashed counter-example is the whole dataset on the card: N*8 bytes with
N = 9,035,582,198 OpenWebText tokens (nanoGPT's prepare.py comment) -> 72.28 GB, computed here.
"""
from diagrams.svg import MUTED, Figure

B, T = 8, 512
N_TOKENS = 9_035_582_198


def draw():
    W, H, x0 = 800, 330, 92
    batch_kib = 8 * B * T / 2**10
    whole_gb = N_TOKENS * 8 / 1e9
    f = Figure("ch04-pipeline", "一个批次从磁盘到显卡的路径：只有最后一步进入显存",
               "数据文件在磁盘上，页缓存、工作进程、预取的批次和锁页内存都在主存里；进入显存的只有当前这一批 token，"
               f"批大小 8、序列长度 512 时是 {batch_kib:.0f} KiB。虚线框是反例：整个数据集先搬上显卡。", W, H)
    lanes = [("磁盘", 12, 70), ("主存（CPU）", 92, 110), ("显存（GPU）", 212, 106)]
    for name, y, h in lanes:
        f.rect(10, y, W - 20, h - 6, "idle", rx=6)
        f.text(18, y + 20, name, anchor="start", bold=True, size=13)
    f.box(x0, 26, 240, 42, "train.bin（uint16 token）", "free", sub="np.memmap 只读映射", size=14)
    boxes = [("页缓存（mmap）", "各进程共用一份", 124), ("工作进程 × num_workers", "dataset[i] → collate_fn", 184),
             ("预取的批次（共享内存）", "num_workers×prefetch_factor", 196), ("锁页内存线程", "pin_memory=True", 136)]
    x, y, h = x0, 128, 52
    centers = []
    for label, sub, w in boxes:
        f.box(x, y, w, h, label, "host", sub=sub, size=14)
        centers.append((x, x + w))
        x += w + 16
    for (_, a), (b, _) in zip(centers, centers[1:]):
        f.arrow(a + 2, y + h / 2, b - 2, y + h / 2)
    f.arrow(x0 + 65, 68, x0 + 65, y - 2)
    f.text(x0 + 72, 88, "访问到哪页读哪页", anchor="start", size=12, color=MUTED)
    px0, px1 = centers[-1]
    bx, bw = px1 - 290, 290
    f.box(bx, 250, bw, 50, "当前批次 [B, T] int64", "temp", sub=f"8·B·T 字节 = {batch_kib:.0f} KiB（B = {B}，T = {T}）", size=14)
    f.arrow((px0 + px1) / 2, y + h + 2, (px0 + px1) / 2, 248)
    f.text((px0 + px1) / 2 - 8, 228, ".to('cuda', non_blocking=True)", anchor="end", size=12, mono=True)
    f.rect(x0, 250, 270, 50, "temp", dash=True)
    f.text(x0 + 135, 271, "反例：整个数据集先 .cuda()", size=14)
    f.text(x0 + 135, 290, f"N×8 字节：OpenWebText ≈ {whole_gb:.2f} GB", size=12, color=MUTED)
    return [f]

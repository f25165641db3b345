"""How long `mkdocs build --strict` takes, with and without the build's speed-ups, in one run.

    python scripts/bench_site.py [--rounds 2]

The speed-ups are the plugin `vramlab-build-speed` (vramlab/mkdocs_speed.py) and the hooks
docs/hooks/search_parallel.py and docs/hooks/jieba_memo.py. The "without" build uses mkdocs.yml
minus those three lines (a temporary copy next to it, removed afterwards). Builds alternate, each in
a fresh process into an empty folder; the script prints every wall time, the medians and their
ratio, and checks that both builds wrote the same search index.
"""
from __future__ import annotations

import filecmp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEEDUPS = ("vramlab-build-speed", "docs/hooks/search_parallel.py", "docs/hooks/jieba_memo.py")


def build(config: str, dest: Path) -> float:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    env.pop("OFFLINE", None)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", config, "-d", str(dest)],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    from vramlab.args import ChineseArgumentParser

    p = ChineseArgumentParser(prog="scripts/bench_site.py")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args(argv)
    lines = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").splitlines(keepends=True)
    without = ROOT / ".mkdocs-without-speedups.yml"
    without.write_text("".join(ln for ln in lines if not any(s in ln for s in SPEEDUPS)), encoding="utf-8")
    times: dict[str, list[float]] = {"with": [], "without": []}
    try:
        with tempfile.TemporaryDirectory(prefix="vramlab-bench-site-") as tmp:
            for r in range(a.rounds):
                for name, config in (("without", without.name), ("with", "mkdocs.yml")):
                    dest = Path(tmp) / f"{name}-{r}"
                    times[name].append(build(config, dest))
                    print(f"第 {r + 1} 轮 {'有' if name == 'with' else '没有'}加速：{times[name][-1]:.1f} s", flush=True)
            same = filecmp.cmp(Path(tmp) / "with-0" / "search" / "search_index.json",
                               Path(tmp) / "without-0" / "search" / "search_index.json", shallow=False)
    finally:
        without.unlink(missing_ok=True)
    fast, slow = statistics.median(times["with"]), statistics.median(times["without"])
    print(f"mkdocs build --strict（冷启动，{os.cpu_count()} 个 CPU 核）：有加速 {fast:.1f} s，没有 {slow:.1f} s，"
          f"快 {slow / fast:.2f} 倍（目标 ≤ 15 s）；搜索索引{'相同' if same else '不同！'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

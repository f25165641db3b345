"""Draw every chapter's diagrams: scripts/diagrams/chNN.py -> docs/assets/figures/*.svg.

    python scripts/draw_diagrams.py           # write the files
    python scripts/draw_diagrams.py --check   # exit 1 if a committed file differs (tests run this)
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "assets" / "figures"
sys.path.insert(0, str(ROOT / "scripts"))


def figures():
    for path in sorted((ROOT / "scripts" / "diagrams").glob("ch[0-9][0-9].py")):
        module = importlib.import_module(f"diagrams.{path.stem}")
        for fig in module.draw():
            yield fig


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--check", action="store_true")
    a = p.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    stale = []
    for fig in figures():
        target = OUT / f"{fig.name}.svg"
        text = fig.svg()
        if a.check:
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                stale.append(target.name)
        else:
            target.write_text(text, encoding="utf-8")
    if stale:
        print("图过期了（改了 scripts/diagrams/ 之后要运行 python scripts/draw_diagrams.py）：" + "、".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Copies of the course notebooks for hosted GPU notebooks (Colab, Kaggle, ModelScope).

    python -m vramlab.hosted OUTDIR --repo https://github.com/OWNER/NAME --ref COMMIT

A hosted kernel has no vramlab, and Colab opens a notebook only from a GitHub branch (Kaggle from a
URL), never from our site build. So the publishing workflow (.github/workflows/pages.yml) writes
these copies and pushes them to a branch of their own (`hosted-notebooks`) that the site's links
open. Each copy is the repository's notebook with one cell put first: it installs vramlab pinned to
the commit the site was built from, so the package and the notebook always agree, and it does
nothing where vramlab is already installed (`make lab`, a local clone).

Copied: every learner notebook (exercises/<id>/<id>.ipynb) and every tutorial
(docs/chapters/chNN-tutorial.ipynb), at the same relative paths, outputs kept.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

BRANCH = "hosted-notebooks"
CELL_ID = "vramlab-install"
PATTERNS = ("exercises/*/*.ipynb", "docs/chapters/ch*-tutorial.ipynb")

_REPO = re.compile(r"^https://[\w.-]+/[\w.-]+/[\w.-]+?(?:\.git)?$")
_REF = re.compile(r"^[0-9A-Za-z][\w./-]*$")

INSTALL_SOURCE = """\
# 在线平台（Colab、Kaggle、ModelScope）上先运行这一格：安装 vramlab（固定在构建课程网站的提交 {short}）。
# 本地用 make lab、make install 打开时 vramlab 已经装好，这一格什么也不做。
import importlib, importlib.util, subprocess, sys
if importlib.util.find_spec("vramlab") is None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "{requirement}"])
    importlib.invalidate_caches()
    print("vramlab 已安装。平台若提示重启内核，重启后从下一格接着运行。")
"""


def requirement(repo: str, ref: str) -> str:
    """pip's requirement for vramlab at `ref` of the repository `repo` (an https URL)."""
    repo = repo.strip().rstrip("/")
    if not _REPO.match(repo):
        raise ValueError(f"仓库地址应该是 https://主机/所有者/仓库 的形式，收到的是 {repo!r}")
    if not _REF.match(ref):
        raise ValueError(f"提交或分支名不合法：{ref!r}")
    if not repo.endswith(".git"):
        repo += ".git"
    return f"vramlab @ git+{repo}@{ref}"


def install_cell(repo: str, ref: str) -> dict:
    source = INSTALL_SOURCE.format(short=ref[:12], requirement=requirement(repo, ref))
    return {"cell_type": "code", "execution_count": None, "id": CELL_ID,
            "metadata": {"vramlab": {"hosted_install": True}}, "outputs": [],
            "source": source.splitlines(True)}


def hosted_copy(notebook: dict, repo: str, ref: str) -> dict:
    """`notebook` with the install cell first (replacing an earlier one: the copy is idempotent)."""
    nb = dict(notebook)
    cells = [c for c in nb.get("cells", []) if c.get("id") != CELL_ID]
    nb["cells"] = [install_cell(repo, ref), *cells]
    return nb


def sources(root: Path) -> list[Path]:
    return sorted(p for pattern in PATTERNS for p in root.glob(pattern))


def write(root: Path, out: Path, repo: str, ref: str) -> list[Path]:
    """Write the hosted copy of every course notebook under `out`; returns their paths."""
    requirement(repo, ref)                          # refuse bad input before writing anything
    written = []
    for src in sources(root):
        rel = src.relative_to(root)
        nb = hosted_copy(json.loads(src.read_text(encoding="utf-8")), repo, ref)
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps(nb, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        written.append(dest)
    (out / "README.md").write_text(
        f"# vramlab 在线 notebook\n\n由 `python -m vramlab.hosted` 从 {repo} 的提交 `{ref}` 生成，"
        "请勿手改：每次发布网站时整个分支会被重写。每份 notebook 的第一格安装这个提交的 vramlab。\n",
        encoding="utf-8")
    return written


def main(argv=None) -> int:
    from .args import ChineseArgumentParser
    parser = ChineseArgumentParser(prog="python -m vramlab.hosted",
                                   description="为 Colab、Kaggle、ModelScope 写出第一格会安装 vramlab 的 notebook 副本")
    parser.add_argument("out", type=Path, help="输出目录")
    parser.add_argument("--repo", required=True, help="课程仓库的 https 地址")
    parser.add_argument("--ref", required=True, help="要安装的提交（发布时是 $GITHUB_SHA）")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="课程仓库根目录")
    args = parser.parse_args(argv)
    try:
        written = write(args.root, args.out, args.repo, args.ref)
    except ValueError as e:
        parser.error(str(e))
    if not written:
        parser.error(f"{args.root} 下没有找到课程 notebook（exercises/、docs/chapters/）")
    print(f"写出 {len(written)} 份 notebook 到 {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

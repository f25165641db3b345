#!/usr/bin/env bash
# 构建课程网站的两个版本和两个下载包 (在仓库根目录运行; jieba 用户词典的路径相对于当前目录):
#   site-offline/  离线版: 直接用浏览器打开 site-offline/index.html (file://) 即可阅读和搜索
#   site/          在线版: 部署到 GitHub Pages 或任何静态服务器; 里面带着
#                    vramlab-offline.zip    离线版打包 (先建离线版、打包, 再建在线版时放进去)
#                    vramlab-notebooks.zip  学员 notebook (exercises/), 每次构建都由 docs/hooks/materials.py 生成
#   "获取课程材料" 页面 (docs/materials.md) 链接这两个包; 只跑 mkdocs build 时没有离线版的包, 页面会说明怎么生成。
# 用法: scripts/build_site.sh [mkdocs 可执行文件, 默认 .venv/bin/mkdocs 或 PATH 里的 mkdocs]
set -euo pipefail
cd "$(dirname "$0")/.."

MKDOCS="${1:-}"
if [[ -z "$MKDOCS" ]]; then
  if [[ -x .venv/bin/mkdocs ]]; then MKDOCS=.venv/bin/mkdocs; else MKDOCS=mkdocs; fi
fi
PY="$(dirname "$MKDOCS")/python"
[[ -x "$PY" ]] || PY=python3
export NO_MKDOCS_2_WARNING=1

echo "==> 离线版 -> site-offline/"
OFFLINE=true "$MKDOCS" build --strict --clean -d site-offline

echo "==> 打包离线版 -> vramlab-offline.zip"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PY" - site-offline "$tmp/vramlab-offline.zip" <<'PY'
import os, sys, zipfile
src, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            z.write(path, os.path.join("vramlab-offline", os.path.relpath(path, src)))
PY

echo "==> 在线版 -> site/ (带 vramlab-offline.zip、vramlab-notebooks.zip)"
env -u OFFLINE VRAMLAB_OFFLINE_ZIP="$tmp/vramlab-offline.zip" "$MKDOCS" build --strict --clean -d site

echo "完成。预览在线版: $MKDOCS serve  (http://127.0.0.1:8000/)"
echo "离线阅读: 用浏览器打开 file://$PWD/site-offline/index.html"
echo "下载包: site/vramlab-offline.zip、site/vramlab-notebooks.zip (离线版里也有 vramlab-notebooks.zip)"

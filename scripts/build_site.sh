#!/usr/bin/env bash
# 构建课程网站的两个版本 (在仓库根目录运行; jieba 用户词典的路径相对于当前目录):
#   site/          在线版, 部署到 GitHub Pages 或任何静态服务器
#   site-offline/  离线版, 直接用浏览器打开 site-offline/index.html (file://) 即可阅读和搜索
# 用法: scripts/build_site.sh [mkdocs 可执行文件, 默认 .venv/bin/mkdocs 或 PATH 里的 mkdocs]
set -euo pipefail
cd "$(dirname "$0")/.."

MKDOCS="${1:-}"
if [[ -z "$MKDOCS" ]]; then
  if [[ -x .venv/bin/mkdocs ]]; then MKDOCS=.venv/bin/mkdocs; else MKDOCS=mkdocs; fi
fi
export NO_MKDOCS_2_WARNING=1

echo "==> 在线版 -> site/"
env -u OFFLINE "$MKDOCS" build --strict --clean -d site

echo "==> 离线版 -> site-offline/"
OFFLINE=true "$MKDOCS" build --strict --clean -d site-offline

echo "完成。预览在线版: $MKDOCS serve  (http://127.0.0.1:8000/)"
echo "离线阅读: 用浏览器打开 file://$PWD/site-offline/index.html"

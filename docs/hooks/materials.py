"""MkDocs hook: where to get the course materials, and how to run a notebook with a GPU.

- `vramlab-notebooks.zip` (the learner notebooks of exercises/, what `make lab` opens, plus a short
  说明) is made in every build, online and offline, and `mkdocs serve`: it is small and never 404s.
- `vramlab-offline.zip` (the offline site) cannot be made inside its own build: scripts/build_site.sh
  builds the offline site first, zips it, and hands the zip to the online build through
  $VRAMLAB_OFFLINE_ZIP. Without it the materials page says how to make it (`make site`) instead of
  showing a link that would 404.
- `<!-- vramlab:materials -->` (docs/materials.md) becomes the download list.
- Every tutorial notebook page (after its h1) and every exercise card (`<!-- vramlab:exercise ID -->`,
  turned into the card by docs/hooks/exercises.py, which must come after this hook in mkdocs.yml)
  gets a box: how to open it locally, and when `extra.repo_link` is set (the published site), one-
  click links to Colab, Kaggle and ModelScope. Plain links: nothing is loaded from those hosts. With
  `extra.hosted_branch` (the workflow pushes it) they open copies whose first cell installs vramlab.
"""
from __future__ import annotations

import html
import io
import os
import re
import zipfile
from pathlib import Path
from urllib.parse import quote

from mkdocs.structure.files import File
from mkdocs.utils import get_relative_url

NOTEBOOKS_ZIP = "vramlab-notebooks.zip"
OFFLINE_ZIP = "vramlab-offline.zip"
OFFLINE_ZIP_ENV = "VRAMLAB_OFFLINE_ZIP"
MATERIALS_PAGE = "materials.md"
# ModelScope documents no "open this notebook from a URL" address: the box links its notebook page
# (free GPU instances), and the materials page says how to bring the notebook there.
MODELSCOPE = "https://modelscope.cn/my/mynotebook"

_MATERIALS = re.compile(r"<!--\s*vramlab:materials\s*-->")
_EXERCISE = re.compile(r"^<!--\s*vramlab:exercise\s+([\w-]+)\s*-->[ \t]*$", re.M)
_TUTORIAL = re.compile(r"^chapters/ch(\d\d)-tutorial\.ipynb$")
_H1_END = re.compile(r"</h1>", re.I)
_GITHUB = re.compile(r"^https://github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")

_README = """vramlab 学员 notebook（{count} 道评分练习）

每道练习是 <编号>/<编号>.ipynb，与课程仓库的 exercises/ 目录相同。

本地运行（推荐）：在课程仓库根目录运行 make lab，它会建好 .venv、装好 vramlab，
再用 JupyterLab 打开 exercises/。没有 GPU 时评分用模拟设备；有 NVIDIA GPU 时可以在检查单元格里
改用 vramlab.check("<编号>", backend="cuda", scale="gpu") 在真卡上评。

在线运行（Colab、Kaggle、ModelScope 等带免费 GPU 的 notebook 平台）：上传 notebook 后，
先在最前面加一个单元格安装 vramlab：
    %pip install -q "vramlab @ git+<课程仓库地址>"
然后从上到下运行。详见课程网站的「获取课程材料」页面。
"""


def _root(config) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def _repo(config) -> tuple[str, str, str, str] | None:
    """(https link, 'owner/name' or '', branch, hosted branch or '') from extra; None when not set."""
    extra = config.get("extra") or {}
    link = str(extra.get("repo_link") or "").strip().rstrip("/")
    if not link:
        return None
    m = _GITHUB.match(link)
    branch = str(extra.get("repo_branch") or "main").strip() or "main"
    hosted = str(extra.get("hosted_branch") or "").strip()
    return link, (f"{m.group(1)}/{m.group(2)}" if m else ""), branch, hosted


def hosted_links(config, path: str) -> list[tuple[str, str]]:
    """[(name, url)] of the hosted notebooks that open `path` (relative to the repository root).

    On the published site (`extra.hosted_branch` set by the workflow) they open the copy on that
    branch, whose first cell installs vramlab (vramlab/hosted.py); otherwise the repository's own
    notebook, to which the learner adds install_line() by hand."""
    repo = _repo(config)
    if repo is None or not repo[1]:
        return []
    _, slug, branch, hosted = repo
    ref = quote(hosted or branch)
    p = quote(path)
    raw = f"https://raw.githubusercontent.com/{slug}/{ref}/{p}"
    links = [
        ("Colab", f"https://colab.research.google.com/github/{slug}/blob/{ref}/{p}"),
        ("Kaggle", f"https://kaggle.com/kernels/welcome?src={quote(raw, safe='')}"),
        ("ModelScope（魔搭，国内可访问）", MODELSCOPE),
    ]
    if hosted:
        links.append(("下载（ModelScope 等平台上传用）", raw))
    return links


def hosted_install(config) -> bool:
    """Whether the hosted links open copies that install vramlab themselves."""
    repo = _repo(config)
    return bool(repo and repo[1] and repo[3])


def install_line(config) -> str:
    """The cell that installs vramlab on a hosted notebook (pip clones the repository)."""
    repo = _repo(config)
    url = (f"https://github.com/{repo[1]}.git" if repo[1] else repo[0]) if repo else "<课程仓库地址>"
    return f'%pip install -q "vramlab @ git+{url}"'


def _offline_build(config) -> bool:
    """Material's offline plugin is on (OFFLINE=true): this build is the one read from file://."""
    for name, plugin in config["plugins"].items():
        if name.split("/")[-1] == "offline":
            return bool(getattr(plugin, "config", {}).get("enabled", False))
    return False


def _a(href: str, text: str) -> str:
    return f'<a href="{html.escape(href, quote=True)}">{html.escape(text)}</a>'


def run_box(config, page, files, *, path: str, kind: str, exercise_id: str = "") -> str:
    """The "how to run it with a GPU" box (HTML) for a notebook at repository path `path`."""
    materials = files.get_file_from_path(MATERIALS_PAGE)
    here = page.file.url
    mat = get_relative_url(materials.url, here) if materials else ""
    mat_link = (lambda anchor, text: _a(f"{mat}#{anchor}", text)) if materials else (lambda anchor, text: text)
    code = lambda s: f"<code>{html.escape(s)}</code>"   # noqa: E731
    if kind == "exercise":
        title = "在哪里运行这道练习（有 GPU 或没有）"
        inner = path.split("/", 1)[1]              # make lab opens exercises/
        on_gpu = f'vramlab.check("{exercise_id}", backend="cuda", scale="gpu")'
        local = (f"<strong>本地</strong>：在仓库根目录运行 {code('make lab')}，在 JupyterLab 里打开 {code(inner)}。"
                 f"没有 GPU 时评分用 CPU 上的模拟设备；有 NVIDIA GPU 时，把检查单元格里的调用改成 "
                 f"{code(on_gpu)} 就在真卡上按 GPU 规模评。")
    else:
        title = "在哪里运行这份教程（有 GPU 或没有）"
        local = (f"<strong>本地</strong>：在仓库根目录运行 {code('make install')}（建 .venv、装好依赖），"
                 f"再运行 {code('.venv/bin/jupyter lab ' + path)}。有 NVIDIA GPU 时教程自动在真卡上测量"
                 f"（{code('vramlab.open_device(' + chr(34) + 'auto' + chr(34) + ')')}），没有时在 CPU 上的模拟设备里运行。")
    links = hosted_links(config, path)
    if links and hosted_install(config):
        online = ("<strong>在线（免费 GPU）</strong>：" + " · ".join(_a(u, n) for n, u in links)
                  + "。链接打开的副本第一格会安装 vramlab（固定在构建这份网站的提交），从上到下运行即可；"
                  + "ModelScope 要先启动实例再上传下载的 notebook，步骤见" + mat_link("online", "获取课程材料") + "。")
    elif links:
        online = ("<strong>在线（免费 GPU）</strong>：" + " · ".join(_a(u, n) for n, u in links)
                  + f"。打开后先在最前面加一个单元格运行 {code(install_line(config))}，再从上到下运行；"
                  + "ModelScope 要先启动实例再导入 notebook，步骤见" + mat_link("online", "获取课程材料") + "。")
    else:
        online = ("<strong>在线（免费 GPU）</strong>：这份网站构建时没有设置课程仓库地址（mkdocs.yml 的 "
                  f"{code('extra.repo_link')}），所以这里没有 Colab、Kaggle、ModelScope 的一键链接；"
                  "手动上传 notebook 的做法见" + mat_link("online", "获取课程材料") + "。")
    return (f'<div class="admonition tip vramlab-run" data-notebook="{html.escape(path, quote=True)}">'
            f'<p class="admonition-title">{title}</p><ul><li>{local}</li><li>{online}</li></ul></div>')


# --------------------------------------------------------------------------- files

def _notebooks_zip(root: Path) -> tuple[bytes, int]:
    """The learner notebooks (exercises/*/*.ipynb) and a short 说明, byte-identical build to build."""
    notebooks = sorted((root / "exercises").glob("*/*.ipynb"))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        def add(name: str, data: bytes):
            info = zipfile.ZipInfo(f"vramlab-notebooks/{name}", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
        add("说明.txt", _README.format(count=len(notebooks)).encode("utf-8"))
        for nb in notebooks:
            add(nb.relative_to(root / "exercises").as_posix(), nb.read_bytes())
    return buf.getvalue(), len(notebooks)


def on_files(files, config):
    data, count = _notebooks_zip(_root(config))
    if count:
        files.append(File.generated(config, NOTEBOOKS_ZIP, content=data))
    offline = os.environ.get(OFFLINE_ZIP_ENV, "")
    if offline and Path(offline).is_file():
        files.append(File.generated(config, OFFLINE_ZIP, abs_src_path=str(Path(offline).resolve())))
    return files


# --------------------------------------------------------------------------- pages

def _download_list(config, page, files) -> str:
    here = page.file.url
    offline_build = _offline_build(config)
    items = []
    nb = files.get_file_from_path(NOTEBOOKS_ZIP)
    if nb is not None:
        items.append(f'- **学员 notebook**：<a href="{get_relative_url(nb.url, here)}" download>{NOTEBOOKS_ZIP}</a>'
                     "（全部评分练习，与仓库的 `exercises/` 相同，附一页说明）")
    else:
        items.append(f"- **学员 notebook**：`{NOTEBOOKS_ZIP}` 没有生成（仓库里找不到 `exercises/`）。")
    off = files.get_file_from_path(OFFLINE_ZIP)
    if off is not None:
        items.append(f'- **离线版网站**：<a href="{get_relative_url(off.url, here)}" download>{OFFLINE_ZIP}</a>'
                     "（解压后用浏览器打开 `vramlab-offline/index.html`，`file://` 下导航和搜索都能用）")
    elif offline_build:
        items.append(f"- **离线版网站**：你正在读的就是离线版。整个文件夹可以直接拷贝；"
                     f"打包好的 `{OFFLINE_ZIP}` 在发布的在线版网站的这一页上。")
    else:
        items.append(f"- **离线版网站**：这份网站是直接用 `mkdocs build`/`mkdocs serve` 构建的，没有带 `{OFFLINE_ZIP}`。"
                     "在仓库根目录运行 `make site`（即 `scripts/build_site.sh`）：它先建离线版 `site-offline/`，"
                     f"打包成 `{OFFLINE_ZIP}`，再建在线版 `site/`，两个压缩包都在 `site/` 里。")
    repo = _repo(config)
    if repo:
        items.insert(0, f"- **课程仓库**：<{repo[0]}>（全部源文件：课程正文、教程源文件、`vramlab` 工具包、练习和测试）")
    else:
        items.insert(0, "- **课程仓库**：这份网站构建时没有设置仓库地址。发布网站时在 `mkdocs.yml` 里设置 "
                        "`extra.repo_link`（或设置环境变量 `VRAMLAB_REPO_LINK`），这里就会显示仓库链接；"
                        "`.github/workflows/pages.yml` 发布时会自动填上。")
    return "\n".join(items) + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if _MATERIALS.search(markdown):
        markdown = _MATERIALS.sub(lambda m: _download_list(config, page, files), markdown)
    root = _root(config)

    def box(m):
        ex = m.group(1)
        path = f"exercises/{ex}/{ex}.ipynb"
        if not (root / path).is_file():
            return m.group(0)
        return m.group(0) + "\n\n" + run_box(config, page, files, path=path, kind="exercise", exercise_id=ex) + "\n"

    return _EXERCISE.sub(box, markdown)


def on_page_content(html_text: str, page, config, files) -> str:
    m = _TUTORIAL.match(page.file.src_uri)
    if not m:
        return html_text
    box = run_box(config, page, files, path=f"docs/{page.file.src_uri}", kind="tutorial")
    end = _H1_END.search(html_text)
    if end is None:
        return box + html_text
    return html_text[:end.end()] + box + html_text[end.end():]

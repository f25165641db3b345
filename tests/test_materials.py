"""docs/hooks/materials.py without a build: the hosted-notebook links, the run box, the download list
and the learner-notebooks zip. (The built pages are checked in a browser in test_mobile_browser.py.)"""
from __future__ import annotations

import importlib.util
import io
import zipfile
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest

pytest.importorskip("mkdocs", reason="网站依赖未安装: pip install -e '.[site]'")

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("materials_hook", REPO / "docs" / "hooks" / "materials.py")
materials = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(materials)

TUTORIAL = "docs/chapters/ch07-tutorial.ipynb"


def config(repo_link: str = "", branch: str = "main", offline: bool = False, hosted: str = "") -> dict:
    plugin = SimpleNamespace(config={"enabled": offline})
    return {"extra": {"repo_link": repo_link, "repo_branch": branch, "hosted_branch": hosted},
            "config_file_path": str(REPO / "mkdocs.yml"),
            "plugins": {"material/offline": plugin}}


class Files:
    def __init__(self, **urls):
        self.urls = urls

    def get_file_from_path(self, path):
        return SimpleNamespace(url=self.urls[path]) if path in self.urls else None


def page(url: str):
    return SimpleNamespace(file=SimpleNamespace(url=url, src_uri="chapters/ch07.md"))


def test_hosted_links_open_the_repository_notebook():
    links = dict(materials.hosted_links(config("https://github.com/acme/vram-course/"), TUTORIAL))
    assert links["Colab"] == "https://colab.research.google.com/github/acme/vram-course/blob/main/" + TUTORIAL
    kaggle = urlsplit(links["Kaggle"])
    assert (kaggle.netloc, kaggle.path) == ("kaggle.com", "/kernels/welcome")
    assert parse_qs(kaggle.query)["src"] == ["https://raw.githubusercontent.com/acme/vram-course/main/" + TUTORIAL]
    modelscope = [u for n, u in links.items() if n.startswith("ModelScope")]
    assert modelscope == ["https://modelscope.cn/my/mynotebook"]
    # another branch; a ".git" address
    links = dict(materials.hosted_links(config("https://github.com/acme/vram-course.git", "course-2027"), TUTORIAL))
    assert links["Colab"].endswith("/acme/vram-course/blob/course-2027/" + TUTORIAL)
    # not set, or not on GitHub: no hosted links (they open GitHub paths)
    assert materials.hosted_links(config(""), TUTORIAL) == []
    assert materials.hosted_links(config("https://gitee.com/acme/vram-course"), TUTORIAL) == []


def test_published_links_open_the_copies_that_install_vramlab():
    cfg = config("https://github.com/acme/vram-course", hosted="hosted-notebooks")
    links = dict(materials.hosted_links(cfg, TUTORIAL))
    assert links["Colab"] == "https://colab.research.google.com/github/acme/vram-course/blob/hosted-notebooks/" + TUTORIAL
    raw = "https://raw.githubusercontent.com/acme/vram-course/hosted-notebooks/" + TUTORIAL
    assert parse_qs(urlsplit(links["Kaggle"]).query)["src"] == [raw]
    assert raw in links.values()                                  # the download for ModelScope
    box = materials.run_box(cfg, page("chapters/ch07/"), Files(**{"materials.md": "materials/"}),
                            path=TUTORIAL, kind="tutorial")
    assert "第一格会安装 vramlab" in box and "%pip install" not in box


def test_install_line_clones_the_repository():
    assert materials.install_line(config("https://github.com/acme/vram-course")) == \
        '%pip install -q "vramlab @ git+https://github.com/acme/vram-course.git"'
    assert "git+https://gitee.com/acme/vram-course" in materials.install_line(config("https://gitee.com/acme/vram-course"))


def test_run_box_with_and_without_a_repository():
    files = Files(**{"materials.md": "materials/"})
    box = materials.run_box(config("https://github.com/acme/vram-course"), page("chapters/ch07/"), files,
                            path="exercises/ch07-checkpoint/ch07-checkpoint.ipynb", kind="exercise",
                            exercise_id="ch07-checkpoint")
    assert "colab.research.google.com/github/acme/vram-course/blob/main/exercises/ch07-checkpoint/ch07-checkpoint.ipynb" in box
    assert "kaggle.com/kernels/welcome?src=" in box and "modelscope.cn/my/mynotebook" in box
    assert "git+https://github.com/acme/vram-course.git" in box
    assert "make lab" in box and "<code>ch07-checkpoint/ch07-checkpoint.ipynb</code>" in box   # make lab opens exercises/
    assert 'href="../../materials/#online"' in box
    plain = materials.run_box(config(""), page("chapters/ch07/"), files, path=TUTORIAL, kind="tutorial")
    assert "colab.research" not in plain and "kaggle.com" not in plain and "extra.repo_link" in plain
    assert f"jupyter lab {TUTORIAL}" in plain


def test_download_list_never_links_a_missing_zip():
    here = page("materials/")
    plain = materials._download_list(config(""), here, Files(**{"vramlab-notebooks.zip": "vramlab-notebooks.zip"}))
    assert 'href="../vramlab-notebooks.zip"' in plain
    assert "vramlab-offline.zip" in plain and "make site" in plain and 'href="../vramlab-offline.zip"' not in plain
    assert "extra.repo_link" in plain
    built = materials._download_list(config("https://github.com/acme/vram-course"), here,
                                     Files(**{"vramlab-notebooks.zip": "vramlab-notebooks.zip",
                                              "vramlab-offline.zip": "vramlab-offline.zip"}))
    assert 'href="../vramlab-offline.zip"' in built and "<https://github.com/acme/vram-course>" in built
    offline = materials._download_list(config("", offline=True), page("materials.html"),
                                       Files(**{"vramlab-notebooks.zip": "vramlab-notebooks.zip"}))
    assert "你正在读的就是离线版" in offline and 'href="vramlab-notebooks.zip"' in offline


def test_learner_notebooks_zip_holds_every_exercise_notebook():
    data, count = materials._notebooks_zip(REPO)
    again, _ = materials._notebooks_zip(REPO)
    assert data == again, "the zip differs from build to build"
    notebooks = sorted((REPO / "exercises").glob("*/*.ipynb"))
    assert count == len(notebooks) >= 33
    z = zipfile.ZipFile(io.BytesIO(data))
    for nb in notebooks:
        assert z.read(f"vramlab-notebooks/{nb.relative_to(REPO / 'exercises').as_posix()}") == nb.read_bytes()
    assert "make lab" in z.read("vramlab-notebooks/说明.txt").decode("utf-8")
    assert not [n for n in z.namelist() if "solution" in n.lower()], "teacher material in the learner zip"

"""vramlab/hosted.py: the notebooks that Colab and Kaggle open on the published site, each with a
first cell that installs vramlab at the site's commit and does nothing where vramlab is installed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vramlab import hosted

REPO = Path(__file__).resolve().parents[1]
SHA = "0123456789abcdef0123456789abcdef01234567"


def test_every_course_notebook_gets_a_copy_with_the_install_cell_first(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    written = hosted.write(REPO, tmp_path, "https://github.com/acme/vram-course", SHA)
    rels = sorted(p.relative_to(tmp_path).as_posix() for p in written)
    expected = sorted(p.relative_to(REPO).as_posix() for p in hosted.sources(REPO))
    assert rels == expected
    assert sum(r.startswith("exercises/") for r in rels) >= 33
    assert sum(r.startswith("docs/chapters/ch") for r in rels) == 30
    for rel in rels:
        copy = json.loads((tmp_path / rel).read_text(encoding="utf-8"))
        original = json.loads((REPO / rel).read_text(encoding="utf-8"))
        first = "".join(copy["cells"][0]["source"])
        assert f"vramlab @ git+https://github.com/acme/vram-course.git@{SHA}" in first, rel
        assert copy["cells"][1:] == original["cells"], f"{rel}: the rest of the notebook changed"
        assert copy["metadata"] == original["metadata"]
        nbformat.validate(nbformat.from_dict(copy))          # what Colab and Kaggle are handed is a valid notebook
    # idempotent: a copy of a copy has one install cell
    again = hosted.hosted_copy(copy, "https://github.com/acme/vram-course", SHA)
    assert [c.get("id") for c in again["cells"]].count(hosted.CELL_ID) == 1


def _run_cell(source: str, vramlab_installed: bool) -> list:
    """Execute the cell's code with find_spec and check_call observed; returns pip's argv, if run."""
    import importlib.util

    calls = []
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *a, **k):
        if name == "vramlab" and not vramlab_installed:
            return None
        return real_find_spec(name, *a, **k)

    orig_check_call = subprocess.check_call
    importlib.util.find_spec, subprocess.check_call = find_spec, lambda argv, **k: calls.append(argv)
    try:
        exec(compile(source, "<install cell>", "exec"), {})
    finally:
        importlib.util.find_spec, subprocess.check_call = real_find_spec, orig_check_call
    return calls


def test_install_cell_installs_only_where_vramlab_is_missing():
    source = "".join(hosted.install_cell("https://github.com/acme/vram-course.git", SHA)["source"])
    assert _run_cell(source, vramlab_installed=True) == []
    calls = _run_cell(source, vramlab_installed=False)
    assert calls == [[sys.executable, "-m", "pip", "install", "-q",
                      f"vramlab @ git+https://github.com/acme/vram-course.git@{SHA}"]]


@pytest.mark.parametrize("repo, ref", [("git@github.com:acme/x.git", SHA), ("http://github.com/acme/x", SHA),
                                       ("https://github.com/acme/x", "; rm -rf /"),
                                       ("https://github.com/acme/x\" --index-url https://evil", SHA)])
def test_bad_repository_or_ref_is_refused_in_chinese(tmp_path, repo, ref, capsys):
    with pytest.raises(SystemExit) as e:
        hosted.main([str(tmp_path / "out"), "--repo", repo, "--ref", ref])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "错误：" in err and ("仓库地址" in err or "提交" in err)
    assert not (tmp_path / "out").exists(), "wrote files for a refused request"

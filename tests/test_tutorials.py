"""Tutorials: every source runs, and the committed notebooks show what the current code prints."""
import nbformat
import pytest

from vramlab import tutorials

SOURCES = tutorials.sources()


def test_there_are_tutorials():
    assert [s.stem for s in SOURCES][:5] == ["ch01", "ch02", "ch03", "ch04", "ch05"]


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.stem)
def test_committed_outputs_are_not_stale(source):
    assert tutorials.stale(source) is None, tutorials.stale(source)


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Every tutorial executed afresh, a few at a time (one process and kernel each)."""
    out = tmp_path_factory.mktemp("tutorials")
    return dict(tutorials.execute_many([(s, out / f"{s.stem}.ipynb") for s in SOURCES]))


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.stem)
def test_tutorial_runs_and_produces_output(source, executed):
    out = executed[source]
    if isinstance(out, Exception):
        raise out
    nb = nbformat.read(out, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not any(o.get("output_type") == "error" for o in c.outputs) for c in code)
    assert sum(len(c.outputs) for c in code) >= 3          # it printed or drew something
    committed = nbformat.read(tutorials.output_for(source), as_version=4)
    assert [c.source for c in committed.cells] == [c.source for c in nb.cells]


def test_stale_detection_notices_a_changed_source(tmp_path, monkeypatch):
    src = tmp_path / "ch99.py"
    src.write_text("# %%\nprint('一')\n", encoding="utf-8")
    monkeypatch.setattr(tutorials, "OUTPUTS", tmp_path)
    tutorials.execute(src)
    assert tutorials.stale(src) is None
    src.write_text("# %%\nprint('二')\n", encoding="utf-8")
    assert "过期" in tutorials.stale(src)

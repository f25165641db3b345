"""Tutorials: every source runs, and the committed notebooks show what the current code prints."""
import jupytext
import nbformat
import pytest

from vramlab import tutorials

SOURCES = tutorials.sources()


def test_there_are_tutorials():
    assert [s.stem for s in SOURCES][:5] == ["ch01", "ch02", "ch03", "ch04", "ch05"]


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.stem)
def test_committed_outputs_are_not_stale(source):
    assert tutorials.stale(source) is None, tutorials.stale(source)


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.stem)
def test_committed_notebook_ran_without_errors(source):
    """The committed notebook is the run (its hashes say of which source and package, checked
    above); re-executing 30 tutorials in every test run would prove nothing more."""
    nb = nbformat.read(tutorials.output_for(source), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not any(o.get("output_type") == "error" for o in c.outputs) for c in code)
    assert sum(len(c.outputs) for c in code) >= 3          # it printed or drew something
    assert [c.source for c in nb.cells] == [c.source for c in jupytext.read(source, fmt="py:percent").cells]


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.stem)
def test_tutorials_do_not_import_grading_code(source):
    """The freshness hash leaves out tutorials.NOT_IMPORTED_BY_TUTORIALS: true only while no tutorial imports them."""
    text = source.read_text(encoding="utf-8")
    for name in tutorials.NOT_IMPORTED_BY_TUTORIALS:
        module = "vramlab." + name.removesuffix(".py")
        assert module not in text and f"from vramlab import {name.removesuffix('.py')}" not in text, (source, module)
    assert "vramlab.check" not in text
    # from the runner module a tutorial takes `publish` alone (the freshness hash counts only that)
    for line in text.splitlines():
        if "vramlab.tutorials" in line or "vramlab import tutorials" in line:
            assert line.split("#")[0].strip() == "from vramlab.tutorials import publish", (source, line)


@pytest.mark.slow
def test_stale_detection_notices_a_changed_source(tmp_path, monkeypatch):
    src = tmp_path / "ch99.py"
    src.write_text("# %%\nprint('一')\n", encoding="utf-8")
    monkeypatch.setattr(tutorials, "OUTPUTS", tmp_path)
    tutorials.execute(src)
    assert tutorials.stale(src) is None
    src.write_text("# %%\nprint('二')\n", encoding="utf-8")
    assert "过期" in tutorials.stale(src)


def test_freshness_hash_covers_what_a_tutorial_imports_and_nothing_else():
    def names(text):
        return {p.relative_to(tutorials.PACKAGE).as_posix() for p in tutorials.import_closure(text)}

    lazy = names("import vramlab\nm = vramlab.measure(lambda: None)\n")     # a lazy attribute of the package
    assert {"__init__.py", "meter.py", "sim/device.py"} <= lazy and not any(n.startswith("grader/") for n in lazy)
    small = names("from vramlab.units import MiB\n")
    assert small == {"__init__.py", "units.py"}
    # publishing a result hashes publish's module, not the runner that executes tutorials
    assert names("from vramlab.tutorials import publish\n") == {"__init__.py", "published.py"}
    text = "from vramlab.units import MiB\nprint(MiB)\n"
    assert tutorials.package_sha256(text) == tutorials.package_sha256(text)
    for source in SOURCES:              # grading code never makes a tutorial stale
        assert not any(n.startswith(("grader/", "exercises/")) for n in names(source.read_text(encoding="utf-8")))


def test_site_only_data_does_not_stale_the_tutorials(tmp_path, monkeypatch):
    """A benchmark appending to vramlab/data/perf/ or new graded evidence (read by the site only) leaves
    every tutorial fresh; a data file the modules do read (anything else under vramlab/) does not."""
    import shutil

    package = tmp_path / "vramlab"
    shutil.copytree(tutorials.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(tutorials, "PACKAGE", package)
    monkeypatch.setattr(tutorials, "_module_file", lambda name: None)     # the data rule alone
    text = SOURCES[0].read_text(encoding="utf-8")
    before = tutorials.package_sha256(text)
    (package / "data" / "perf" / "history.jsonl").write_text("{}\n", encoding="utf-8")
    (package / "data" / "evidence" / "new.json").write_text("{}\n", encoding="utf-8")
    assert tutorials.package_sha256(text) == before
    (package / "data" / "h200_gpt2_peaks.md").write_text("changed\n", encoding="utf-8")
    assert tutorials.package_sha256(text) != before


SHARED = ("pad", "mib", "width", "free_port", "banner", "use_cjk_font")


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.stem)
def test_tutorials_use_the_shared_helpers(source):
    """pad(), mib(), free_port() and the environment banner live in vramlab.display: a tutorial
    that defines its own copy (or prints the banner lines by hand) drifts from the others."""
    import re

    text = source.read_text(encoding="utf-8")
    own = [name for name in SHARED if re.search(rf"^def {name}\(", text, re.M)]
    assert not own, f"{source.name} defines {own}: import them from vramlab.display"
    assert not re.search(r'^print\("(Python|PyTorch) ', text, re.M), f"{source.name}: use vramlab.display.banner()"

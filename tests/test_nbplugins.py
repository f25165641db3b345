"""nbgrader's export and checksum behaviours that the course changes (vramlab/grader/nbplugins.py),
on stand-ins for the gradebook: the end-to-end run is tests/test_nbgrader.py::test_class_end_to_end."""
from __future__ import annotations

import logging
import types

from nbformat.notebooknode import NotebookNode

from vramlab.grader.nbplugins import NOTHING, AssignedCsvExport, RestoreHiddenTests

STORED = "import vramlab\nvramlab.check('ch05-accumulation')\n### BEGIN HIDDEN TESTS\nassert ok\n### END HIDDEN TESTS"
RELEASED = "import vramlab\nvramlab.check('ch05-accumulation')"


def _restorer(caplog):
    pp = RestoreHiddenTests()
    pp.log = logging.getLogger("test-restore")
    pp.notebook_id, pp.assignment_id = "nb", "ch05-accumulation"
    pp.gradebook = types.SimpleNamespace(
        find_source_cell=lambda *a: types.SimpleNamespace(source=STORED, cell_type="code"))
    return pp


def test_an_untouched_locked_cell_raises_no_checksum_alarm(caplog):
    pp = _restorer(caplog)
    pp._submitted = RELEASED
    with caplog.at_level(logging.INFO, logger="test-restore"):
        pp.report_change("check", "checksum", "a", "b")
    assert "has changed" not in caplog.text and "隐藏测试" in caplog.text


def test_a_changed_locked_cell_still_warns(caplog):
    pp = _restorer(caplog)
    pp._submitted = RELEASED + "\nvramlab.check = lambda *a: None"
    with caplog.at_level(logging.INFO, logger="test-restore"):
        pp.report_change("check", "checksum", "a", "b")
        pp.report_change("check", "points", 10.0, 20.0)
    assert caplog.text.count("has changed") == 2


def test_export_keeps_the_assignments_handed_in(monkeypatch):
    seen = {}
    monkeypatch.setattr("nbgrader.plugins.export.CsvExportPlugin.export",
                        lambda self, gb: seen.setdefault("assignment", list(self.assignment)))
    gb = types.SimpleNamespace(assignments=[types.SimpleNamespace(name="ch05-accumulation", submissions=[1]),
                                            types.SimpleNamespace(name="ch07-checkpoint", submissions=[])])
    AssignedCsvExport().export(gb)
    assert seen["assignment"] == ["ch05-accumulation"]
    seen.clear()
    AssignedCsvExport(assignment=["ch07-checkpoint"]).export(gb)       # named: exported as asked
    assert seen["assignment"] == ["ch07-checkpoint"]
    seen.clear()
    AssignedCsvExport().export(types.SimpleNamespace(assignments=[gb.assignments[1]]))
    assert seen["assignment"] == [NOTHING]                              # nothing handed in: the header only

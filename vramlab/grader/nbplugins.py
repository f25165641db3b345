"""Two nbgrader 0.9 behaviours the course changes (nbgrader_config.py wires them in).

* `AssignedCsvExport` (`nbgrader export`): nbgrader writes a row for every assignment in the
  gradebook and every student, a 0 where nothing was handed in. `generate_assignment` puts all 33
  exercises in the gradebook, so a class that was given two exported 31 zeros per student. This
  exporter keeps the assignments somebody handed in (at least one submission in the gradebook),
  unless `--assignment` names them, and says which it left out.
* `RestoreHiddenTests` (autograde): nbgrader stores a locked cell's checksum in the gradebook
  BEFORE it removes the `### BEGIN HIDDEN TESTS` region from the released notebook, so the
  released, untouched cell never matches it and every autograde warned "Attribute 'checksum' for
  cell ... has changed!" (jupyter/nbgrader#1961, open). nbgrader then puts the stored source,
  hidden tests included, back: that is intended. This keeps nbgrader's behaviour and its warning
  for a cell the learner did change; an untouched cell (its source is the stored source with the
  hidden region removed) gets an info line instead.
"""
from __future__ import annotations

from nbformat.notebooknode import NotebookNode
from nbgrader.plugins.export import CsvExportPlugin
from nbgrader.preprocessors import ClearHiddenTests, OverwriteCells

NOTHING = "\0"          # an assignment name no gradebook has: the header only


class AssignedCsvExport(CsvExportPlugin):
    """CSV export of the assignments that were handed in (or those named with --assignment)."""

    def export(self, gradebook) -> None:
        if not self.assignment:
            names = [a.name for a in gradebook.assignments]
            handed_in = [a.name for a in gradebook.assignments if a.submissions]
            left_out = [n for n in names if n not in handed_in]
            if left_out:
                self.log.info("没有任何提交的 %d 个作业不导出（%s）；要导出它们，用 --assignment 指定",
                              len(left_out), "、".join(left_out[:10]) + ("……" if len(left_out) > 10 else ""))
            self.assignment = handed_in or [NOTHING]
        super().export(gradebook)


class RestoreHiddenTests(OverwriteCells):
    """nbgrader's OverwriteCells, quiet about the checksum of a locked cell the learner did not touch."""

    def preprocess_cell(self, cell, resources, cell_index):
        self._submitted = cell.source
        return super().preprocess_cell(cell, resources, cell_index)

    def report_change(self, name: str, attr: str, old, new) -> None:
        if attr == "checksum" and self._untouched(name):
            self.log.info("单元格 %s 没有改动：按原样放回发布时去掉的隐藏测试（nbgrader#1961，这里校验和不同是预期的）", name)
            return
        super().report_change(name, attr, old, new)

    def _untouched(self, grade_id: str) -> bool:
        stored = self.gradebook.find_source_cell(grade_id, self.notebook_id, self.assignment_id)
        released = NotebookNode(source=stored.source, cell_type=stored.cell_type, metadata={})
        if not ClearHiddenTests(parent=self)._remove_hidden_test_region(released):
            return False                    # no hidden tests: a different checksum is a real change
        return released.source == self._submitted

"""One vocabulary for memory (issue 31): the Chinese label of a memory category is written once, in
vramlab/vocab.py, and every table, report, trace and calculator takes it from there."""
from __future__ import annotations

import re
from pathlib import Path

from vramlab import vocab

PACKAGE = Path(__file__).resolve().parents[1] / "vramlab"


def _label_literals(text: str) -> list[str]:
    """`"activations": "激活值"` or `"activations": ("激活值", ...)`: a category key mapped to a short
    Chinese name (an explanation, a sentence with ：or 。 like estimate.py's notes, is not a label)."""
    keys = "|".join(map(re.escape, vocab.CATEGORIES))
    return re.findall(rf'"({keys})"\s*:\s*\(?\s*"(?=[^"：。]{{1,24}}")[^"]*[\u4e00-\u9fff][^"]*"', text)


def test_detector_finds_a_label_table():
    """The scan below can fail: it sees a table written the way the five old ones were."""
    assert _label_literals('X = {"parameters": "参数", "gradients": ("梯度", "低精度")}') == ["parameters", "gradients"]
    assert _label_literals('SAVED = {"temporaries": 3}') == []
    assert _label_literals('NOTE = {"gradients": "推理：没有梯度。"}') == []


def test_no_category_label_table_outside_vocab():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "vocab.py" and path.parent == PACKAGE:
            continue
        hits = _label_literals(path.read_text(encoding="utf-8"))
        if hits:
            found[str(path.relative_to(PACKAGE))] = hits
    assert not found, f"memory-category labels written outside vramlab/vocab.py: {found}"


def test_every_table_shows_the_same_words():
    from vramlab import cli, plan, webdata
    from vramlab.grader import feedback
    from vramlab.grader.kinds import common
    from vramlab.trace import format as trace_format

    tables = {"cli": cli.CATEGORY_ZH, "plan": plan.CATEGORY_ZH, "webdata": webdata.CATEGORY_ZH,
              "feedback": feedback.CATEGORY_ZH, "trace": trace_format.CATEGORY_ZH,
              "grading report": {k: v[0] for k, v in common.MEMORY_CATEGORY_ZH.items()}}
    for name, table in tables.items():
        for key, label in table.items():
            assert label == vocab.label(key), (name, key, label)

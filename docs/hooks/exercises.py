"""MkDocs hook: chapter pages show each graded exercise from its spec, not from a copy.

A chapter writes `<!-- vramlab:exercise ch07-checkpoint -->` where the exercise card belongs; the
card (title, function, pass criteria, where the notebook is, how to check it) is generated from
`vramlab.exercises` — the same spec the notebook, the reference solution and the grader use.
An unknown id fails the build. `<!-- vramlab:exercise-table -->` becomes the table of every exercise
(id, chapter, title, how it is judged), also from the specs.
"""
from __future__ import annotations

import re

from mkdocs.exceptions import PluginError

_MARKER = re.compile(r"<!--\s*vramlab:exercise\s+([\w-]+)\s*-->")
_TABLE = re.compile(r"<!--\s*vramlab:exercise-table\s*-->")
_JUDGED_ZH = {"estimate": "估算误差", "monitor": "测量误差", "max_batch": "答案与试探次数",
              "reserved_gap": "reserved − allocated"}
_STAGE_ZH = {"1": "基础篇", "2": "进阶篇", "3": "高级篇"}


def exercise_table(src_uri: str) -> str:
    """Markdown table of all exercises; chapter links are relative to the page's source file."""
    from vramlab.exercises import EXERCISES

    up = "../" * src_uri.count("/")
    rows = ["| 编号 | 章节 | 练习 | 评什么 |", "|---|---|---|---|"]
    for spec in EXERCISES.values():
        judged = _JUDGED_ZH.get(spec.kind) or _JUDGED_ZH.get(spec.metric, "峰值显存")
        ranks = spec.ci.settings.world_size
        where = f"（{ranks} 个进程）" if ranks > 1 else ""
        stage = re.fullmatch(r"stage(\d)-challenge", spec.id)      # a stage's challenge has its own page
        where_taught = (f"[{_STAGE_ZH[stage.group(1)]}挑战]({up}challenges/stage{stage.group(1)}.md)" if stage
                        else f"[第 {spec.chapter} 章]({up}chapters/ch{spec.chapter:02d}.md)")
        rows.append(f"| `{spec.id}` | {where_taught} | {spec.title} | {judged}{where} |")
    return "\n".join(rows) + "\n"


def exercise_card(exercise_id: str) -> str:
    from vramlab.exercises import get_exercise, notebook_path
    from vramlab.exercises.spec import criteria_zh

    try:
        spec = get_exercise(exercise_id)
    except KeyError as e:
        raise PluginError(str(e)) from None
    body = [
        f"要写的函数：`{spec.signature.rstrip(':')}`",
        "",
        "通过标准（评分器检查的就是这些）：",
        "",
        *criteria_zh(spec),
        "",
        f"练习 notebook：`{notebook_path(spec.id)}`（`make lab` 打开）；在 notebook 里运行 "
        f"`vramlab.check(\"{spec.id}\")`，或在终端里 `vramlab grade {spec.id} {notebook_path(spec.id)}`。",
    ]
    indented = "\n".join(("    " + line) if line else "" for line in body)
    return f'!!! abstract "评分练习 `{spec.id}`：{spec.title}（{spec.points} 分）"\n\n{indented}\n'


def on_page_markdown(markdown: str, page, config, files) -> str:
    markdown = _TABLE.sub(lambda m: exercise_table(page.file.src_uri), markdown)
    return _MARKER.sub(lambda m: exercise_card(m.group(1)), markdown)

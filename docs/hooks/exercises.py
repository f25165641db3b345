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
_METRIC_ZH = {"reserved_gap": "reserved − allocated"}       # a memory exercise judged on another metric
_STAGE_ZH = {"1": "基础篇", "2": "进阶篇", "3": "高级篇"}


def exercise_table(src_uri: str) -> str:
    """Markdown table of all exercises; chapter links are relative to the page's source file."""
    from vramlab.exercises import EXERCISES
    from vramlab.grader.kinds import traits

    up = "../" * src_uri.count("/")
    from vramlab.evidence import committed, exercise_figures

    reports = committed()
    rows = ["| 编号 | 章节 | 练习 | 评什么 | 模拟设备上参考答案的比值 | GPU 上 |", "|---|---|---|---|---|---|"]
    for spec in EXERCISES.values():
        kind_traits = traits(spec.kind)
        judged = kind_traits.judged_zh
        if kind_traits.report == "ratio":
            judged = _METRIC_ZH.get(spec.metric, judged)
        ranks = spec.ci.settings.world_size
        where = f"（{ranks} 个进程）" if ranks > 1 else ""
        stage = re.fullmatch(r"stage(\d)-challenge", spec.id)      # a stage's challenge has its own page
        where_taught = (f"[{_STAGE_ZH[stage.group(1)]}挑战]({up}challenges/stage{stage.group(1)}.md)" if stage
                        else f"[第 {spec.chapter} 章]({up}chapters/ch{spec.chapter:02d}.md)")
        figures = exercise_figures(spec.id, reports)
        sim, gpu = figures["sim"], figures["cuda"]
        rows.append(f"| `{spec.id}` | {where_taught} | {spec.title} | {judged}{where} | "
                    f"{_figure(sim.get('solution')) if sim else '尚未测量'} | "
                    f"{_figure(gpu.get('solution')) if gpu else '尚未在 GPU 上测量'} |")
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
    body += ["", *_evidence_lines(spec.id)]
    indented = "\n".join(("    " + line) if line else "" for line in body)
    return f'!!! abstract "评分练习 `{spec.id}`：{spec.title}（{spec.points} 分）"\n\n{indented}\n'


def _figure(row: dict | None) -> str:
    if row is None:
        return "—"
    if "error" in row:
        return "评分出错"
    ratio = f"{row['ratio']:.3f}" if row.get("ratio") is not None else "—"
    return f"{ratio}，{'通过' if row['passed'] else '未通过'}"


def _evidence_lines(exercise_id: str) -> list[str]:
    """The reference's and the starter's graded figures on the simulated device and on a GPU, from
    the committed evidence (vramlab/evidence.py, `vramlab evidence`), each with its provenance."""
    from vramlab.evidence import exercise_figures

    figures = exercise_figures(exercise_id)
    lines = ["实测（参考答案和起始代码各评一次：评分器给出的比值与结论）：", "",
             "| 设备 | 参考答案 | 起始代码 | 来源 |", "|---|---|---|---|"]
    for backend, name in (("sim", "模拟设备"), ("cuda", "GPU")):
        got = figures[backend]
        if got is None:
            lines.append(f"| {name} | 尚未在 GPU 上测量 | | |" if backend == "cuda" else f"| {name} | 尚未测量 | | |")
        else:
            lines.append(f"| {name} | {_figure(got.get('solution'))} | {_figure(got.get('starter'))} | "
                         f"{got['provenance']} |")
    return lines


def on_page_markdown(markdown: str, page, config, files) -> str:
    markdown = _TABLE.sub(lambda m: exercise_table(page.file.src_uri), markdown)
    return _MARKER.sub(lambda m: exercise_card(m.group(1)), markdown)

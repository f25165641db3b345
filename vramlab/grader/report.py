"""Chinese feedback for a grading result (the dict of vramlab.grader.core)."""
from __future__ import annotations

from ..units import fmt_bytes
from .feedback import choose_hint, figure_svg, memory_lines
from .kinds import traits


def memory_of(r: dict) -> tuple[dict | None, bool]:
    """The memory view to show: the failed hidden case's (in shares of the starter's peak), else the
    visible case's. (view, whether it is a hidden case's)."""
    if r.get("hidden_failed"):
        return r.get("hidden_memory"), True
    return r.get("memory"), False


def figure_of(r: dict) -> str | None:
    """The result's timeline figure (SVG text), or None when nothing was recorded (CUDA, estimates)."""
    view, hidden = memory_of(r)
    title = f"练习 {r.get('exercise')}：{'隐藏配置里的' if hidden else ''}已分配显存，起始代码与你的代码"
    return figure_svg(view, title)


def format_result(r: dict, figure_path: str | None = None) -> str:
    """The report `vramlab grade` prints and `vramlab.check()` shows; `figure_path`: where the CLI
    saved the timeline figure (named in the report)."""
    lines = list(r.get("warnings") or [])        # e.g. no OS sandbox on this machine
    status = "✅ 通过" if r.get("passed") else "❌ 未通过"
    lines.append(f"{status}  练习 {r['exercise']}  得分 {r['score']}/{r['max_score']}"
                 f"（{'模拟设备' if r.get('backend') == 'sim' else 'CUDA'}，规模 {r.get('scale')}）")
    if r.get("hidden_failed"):      # the figures below are the visible case's, which passed
        lines.append(f"  （下面几行是你看到的配置的结果，它通过了；没通过的是隐藏配置 {r['hidden_failed']}，见“说明”）")
    headline = traits(r.get("kind")).report
    if headline == "error":      # ratio = worst relative error over the cases
        if r.get("ratio") is not None:
            lines.append(f"  误差最大的用例     你的结果 {fmt_bytes(r['peak_bytes'])}，实测 {fmt_bytes(r['baseline_peak_bytes'])}")
        lines.append(f"  最大相对误差       {'-' if r.get('ratio') is None else format(r['ratio'], '.2%')}"
                     f"（允许 ≤ {r['target_ratio']:.0%}）")
    elif headline == "answer":
        if r.get("answer") is not None:
            lines.append(f"  你的答案           batch = {r['answer']}（复查{'通过' if r.get('correct') else '未通过'}）")
            lines.append(f"  试探次数           {r['trials']} 次（允许 ≤ {r['allowed_trials']} 次）")
    elif r.get("metric") == "reserved_gap" and r.get("ratio") is not None:
        lines.append(f"  你的 reserved − allocated   {fmt_bytes(r['metric_bytes'])}")
        lines.append(f"  起始代码的                  {fmt_bytes(r['baseline_metric_bytes'])}")
        lines.append(f"  比值               {r['ratio']:.2f}（目标 ≤ {r['target_ratio']:.2f}）")
    elif r.get("ratio") is not None:
        lines.append(f"  你的峰值显存       {fmt_bytes(r['peak_bytes'])}")
        lines.append(f"  起始代码峰值       {fmt_bytes(r['baseline_peak_bytes'])}")
        lines.append(f"  比值               {r['ratio']:.2f}（目标 ≤ {r['target_ratio']:.2f}）")
        if r.get("rank_peak_bytes"):
            lines.append(f"  各 rank 峰值       {'、'.join(fmt_bytes(x) for x in r['rank_peak_bytes'])}")
    else:
        lines.append(f"  目标比值           ≤ {r['target_ratio']:.2f}")
    if r.get("correct") is not None:
        extra = ""
        if r.get("loss_max_rel_err") is not None and r.get("update_rel_err") is not None:
            extra = f"（损失最大相对误差 {r['loss_max_rel_err']:.2g}，参数更新相对误差 {r['update_rel_err']:.2g}）"
        lines.append(f"  结果正确           {'是' if r['correct'] else '否'}{extra}")
    # step time only where a spec judges it: unjudged, it varied several-fold with the machine's load
    if r.get("time_ratio") is not None and r.get("max_time_ratio"):
        lines.append(f"  单步耗时           是起始代码的 {r['time_ratio']:.2f} 倍（允许 {r['max_time_ratio']:.2f} 倍）")
    if r.get("hidden_cases"):
        lines.append(f"  隐藏配置           {r.get('hidden_passed', 0)}/{r['hidden_cases']} 个通过"
                     + ("" if r.get("passed") or r.get("hidden_failed") else "（你看到的配置通过之后才评）"))
    lines.append(f"  说明               {r.get('reason', '')}")
    view, hidden = memory_of(r)
    if view:
        if hidden:
            lines.append(f"  下面是隐藏配置 {r['hidden_failed']} 里两次运行的显存，按起始代码在那里的峰值折算成百分比：")
        # the largest live tensors where memory is what failed; a wrong result or a crash has other causes
        lines += memory_lines(view, top_n=8 if r.get("category") in ("too_much_memory", "oom") else 0)
    chosen = choose_hint(r)
    if chosen:
        i, why = chosen
        n = len(r["hints"])
        lines.append(f"  先想一想（第 {i + 1}/{n} 条提示，按“{why}”挑的）：{r['hints'][i]}")
        if n > 1:
            lines.append(f"  （notebook 开头的提示一条一条折叠着，越往后越接近答案；最后一条直接给出做法）")
    if figure_path:
        lines.append(f"  时间线图           {figure_path}（起始代码与你的代码每一步的已分配显存）")
    return "\n".join(lines)

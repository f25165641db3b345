"""Chinese feedback for a grading result (the dict of vramlab.grader.core)."""
from __future__ import annotations

from ..units import fmt_bytes


def format_result(r: dict) -> str:
    lines = list(r.get("warnings") or [])        # e.g. no OS sandbox on this machine
    status = "✅ 通过" if r.get("passed") else "❌ 未通过"
    lines.append(f"{status}  练习 {r['exercise']}  得分 {r['score']}/{r['max_score']}"
                 f"（{'模拟设备' if r.get('backend') == 'sim' else 'CUDA'}，规模 {r.get('scale')}）")
    if r.get("kind") in ("estimate", "monitor"):      # ratio = worst relative error over the cases
        if r.get("ratio") is not None:
            lines.append(f"  误差最大的用例     你的结果 {fmt_bytes(r['peak_bytes'])}，实测 {fmt_bytes(r['baseline_peak_bytes'])}")
        lines.append(f"  最大相对误差       {'-' if r.get('ratio') is None else format(r['ratio'], '.2%')}"
                     f"（允许 ≤ {r['target_ratio']:.0%}）")
    elif r.get("kind") == "max_batch":
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
    if r.get("time_ratio") is not None:
        lines.append(f"  单步耗时           {r['step_seconds'] * 1000:.0f} ms，是起始代码的 {r['time_ratio']:.2f} 倍"
                     + (f"（允许 {r['max_time_ratio']:.2f} 倍）" if r.get("max_time_ratio") else "（仅供参考，不计分）"))
    if r.get("hidden_cases"):
        lines.append(f"  隐藏配置           {r.get('hidden_passed', 0)}/{r['hidden_cases']} 个通过"
                     + ("" if r.get("passed") or r.get("hidden_failed") else "（你看到的配置通过之后才评）"))
    lines.append(f"  说明               {r.get('reason', '')}")
    if not r.get("passed") and r.get("hints") and r.get("category") in ("too_much_memory", "incorrect", "technique", "slow", "oom",
                                                                          "too_many_trials"):
        # the first hint only: it asks a question; later ones come nearer to the answer, one at a time in the notebook
        lines.append(f"  先想一想：{r['hints'][0]}")
        if len(r["hints"]) > 1:
            lines.append(f"  （notebook 里还有 {len(r['hints']) - 1} 条提示，一条一条展开，越往后越接近答案）")
    return "\n".join(lines)

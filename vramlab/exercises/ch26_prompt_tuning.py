"""第 26 章 用 peft 做 Prompt Tuning（ch26-prompt-tuning）.

Kind "finetune" with the method prompt tuning (`PromptTuningConfig`): only the virtual-token
embeddings train. The virtual tokens lengthen every sequence, so the first loss differs from full
fine-tuning's (no same-start check).
"""
from .spec import finetune_exercise

SOLUTION = '''\
from peft import PromptTuningConfig, get_peft_model


def prepare_model(model):
    """Prompt Tuning：在输入前面拼 16 个可训练的“虚拟 token”嵌入，模型本身全部冻结。
    可训练参数只有 16 × 隐藏维度个。"""
    config = PromptTuningConfig(num_virtual_tokens=16, task_type="CAUSAL_LM")
    return get_peft_model(model, config)
'''

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = finetune_exercise(
    id="ch26-prompt-tuning",
    chapter=26,
    title="Prompt Tuning：只训练输入前面的几个虚拟 token",
    task=(
        "请用 **peft 的 Prompt Tuning**（`PromptTuningConfig` + `get_peft_model`）包装模型："
        "模型全部冻结，只训练拼在输入前面的虚拟 token 嵌入。虚拟 token 让每条序列变长，"
        "所以第 1 步的损失与全量微调不同；评分器要求训练几步后损失下降、可训练参数很少、峰值显存达标。"
    ),
    solution=SOLUTION,
    method="prompt_tuning",
    same_start=False,
    target_ratio=0.5,
    hints=(
        "`from peft import PromptTuningConfig, get_peft_model`；`PromptTuningConfig(num_virtual_tokens=16, task_type=\"CAUSAL_LM\")`。",
        "虚拟 token 越多，每层的激活值越多：序列长度变成 原长 + num_virtual_tokens。",
    ),
)

"""第 27 章 用 peft 做 P-Tuning v2（ch27-prefix-tuning）.

Kind "finetune" with the method P-Tuning v2 = deep prompt tuning (`PrefixTuningConfig`): trainable
key/value prefixes at every layer. The prefixes change the first loss (no same-start check).
"""
from .spec import finetune_exercise

SOLUTION = '''\
from peft import PrefixTuningConfig, get_peft_model


def prepare_model(model):
    """P-Tuning v2（深度提示）：每一层的注意力前面都拼 16 个可训练的 key/value 前缀，模型本身冻结。
    不用重参数化 MLP（prefix_projection=False），训练时也不多占那份显存。"""
    config = PrefixTuningConfig(num_virtual_tokens=16, prefix_projection=False, task_type="CAUSAL_LM")
    return get_peft_model(model, config)
'''

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = finetune_exercise(
    id="ch27-prefix-tuning",
    chapter=27,
    title="P-Tuning v2：每一层都有可训练的前缀",
    task=(
        "请用 **peft 的 `PrefixTuningConfig`**（它就是 P-Tuning v2 的深度提示）包装模型："
        "每一层注意力的 key/value 前面拼上可训练的前缀，模型本身冻结。前缀改变了模型的输出，"
        "所以第 1 步的损失与全量微调不同；评分器要求训练几步后损失下降、可训练参数很少、峰值显存达标。"
    ),
    solution=SOLUTION,
    method="prefix_tuning",
    same_start=False,
    target_ratio=0.5,
    hints=(
        "`from peft import PrefixTuningConfig, get_peft_model`；`PrefixTuningConfig(num_virtual_tokens=16, task_type=\"CAUSAL_LM\")`。",
        "`prefix_projection=True` 会加一个重参数化 MLP（P-Tuning v2 论文说大多数任务不需要），训练时多占显存。",
    ),
)

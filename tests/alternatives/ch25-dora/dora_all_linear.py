# expect: too_much_memory
# 反例：把 LoRA 那一题的 all-linear 原样搬过来加上 use_dora。方法对、覆盖也对，但 gate/up 的输出是
# 中间维度，DoRA 为它们多存的激活值和临时张量让峰值超出目标。
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, use_dora=True, target_modules="all-linear",
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)

# expect: incorrect
# 反例：init_lora_weights=False 让 B 也随机初始化，旁路一开始就不是零，套上 LoRA 就改变了模型，
# 第 1 步的损失与全量微调不同。
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM",
                        init_lora_weights=False)
    return get_peft_model(model, config)

# expect: technique
# 反例：方法用错了，照搬上一章的 LoRA（没有 use_dora），基座冻结、显存也达标，但不是 DoRA。
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                        target_modules=["q_proj", "v_proj", "down_proj"])
    return get_peft_model(model, config)

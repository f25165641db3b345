# expect: incorrect
# 反例：LoRA 没问题，但把词嵌入和输出层放进 modules_to_save，它们整个变成可训练的副本，
# 可训练参数超过 10% 的上限。
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM",
                        modules_to_save=["embed_tokens", "lm_head"])
    return get_peft_model(model, config)

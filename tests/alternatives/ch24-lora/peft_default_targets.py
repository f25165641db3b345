# expect: technique
# 反例：照抄最短的写法，不给 target_modules。peft 对 Llama 的默认目标只有 q_proj 和 v_proj，
# 其余五个线性层没有旁路，不满足"每一个线性层都要适配"。
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM"))

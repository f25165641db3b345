# expect: too_much_memory
# 反例：以为虚拟 token 越多越好，给 200 个。序列从 64 变成 264，每一层的激活值随之变多，峰值超出目标。
from peft import PromptTuningConfig, get_peft_model


def prepare_model(model):
    return get_peft_model(model, PromptTuningConfig(num_virtual_tokens=200, task_type="CAUSAL_LM"))

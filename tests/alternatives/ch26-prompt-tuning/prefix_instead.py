# expect: technique
# 反例：方法用错了，用的是前缀微调（每一层的键值前缀），不是只在输入端拼虚拟 token 的提示微调。
from peft import PrefixTuningConfig, get_peft_model


def prepare_model(model):
    return get_peft_model(model, PrefixTuningConfig(num_virtual_tokens=16, task_type="CAUSAL_LM"))

# expect: technique
# 反例：方法用错了，只在输入端拼虚拟 token（提示微调），不是每一层都有前缀的 P-Tuning v2。
from peft import PromptTuningConfig, get_peft_model


def prepare_model(model):
    return get_peft_model(model, PromptTuningConfig(num_virtual_tokens=16, task_type="CAUSAL_LM"))

# expect: pass
# 64 个前缀 token（论文对序列标注用 100 左右）。前缀只在注意力里出现，不让序列变长，
# 所以前缀长度几乎不影响峰值；可训练参数仍在预算内。
from peft import PrefixTuningConfig, get_peft_model


def prepare_model(model):
    return get_peft_model(model, PrefixTuningConfig(num_virtual_tokens=64, task_type="CAUSAL_LM"))

# expect: incorrect
# 反例：照着 Prefix Tuning 论文打开重参数化投影（prefix_projection=True，隐藏维度取默认）。
# 投影 MLP 的参数比前缀本身大得多，可训练参数超出 2% 的预算。
from peft import PrefixTuningConfig, get_peft_model


def prepare_model(model):
    config = PrefixTuningConfig(num_virtual_tokens=16, prefix_projection=True, task_type="CAUSAL_LM")
    return get_peft_model(model, config)

# expect: exception|technique
# 照着看到的 4 层写死 num_layers=4。可见配置通过；隐藏配置的层数不同，前缀表的层数与模型对不上。
from peft import PrefixTuningConfig, get_peft_model


def prepare_model(model):
    return get_peft_model(model, PrefixTuningConfig(num_virtual_tokens=16, num_layers=4, task_type="CAUSAL_LM"))

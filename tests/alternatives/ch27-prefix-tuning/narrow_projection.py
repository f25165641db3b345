# expect: pass
# 要重参数化，但把投影的隐藏维度设得比前缀长度小（encoder_hidden_size=8 < 32 个虚拟 token）：
# 所有层的前缀被限制在一个共享的低维子空间里，参数比不投影还少，在预算内。
from peft import PrefixTuningConfig, get_peft_model


def prepare_model(model):
    config = PrefixTuningConfig(num_virtual_tokens=32, prefix_projection=True, encoder_hidden_size=8,
                                task_type="CAUSAL_LM")
    return get_peft_model(model, config)

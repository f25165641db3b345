# expect: exception
# 照着看到的模型把维度写死（token_dim=256、num_layers=4、num_attention_heads=4）。可见配置通过；
# 隐藏配置的宽度不同，虚拟 token 的嵌入拼不到输入上，运行出错。
from peft import PromptTuningConfig, get_peft_model


def prepare_model(model):
    config = PromptTuningConfig(num_virtual_tokens=16, token_dim=256, num_layers=4, num_attention_heads=4,
                                num_transformer_submodules=1, task_type="CAUSAL_LM")
    return get_peft_model(model, config)

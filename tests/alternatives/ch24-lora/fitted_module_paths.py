# expect: technique
# 照着 print(model) 的输出把第 0–3 层的完整模块路径写成正则。可见配置通过；隐藏配置多出来的层没有旁路。
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                        target_modules=r"model\.layers\.[0-3]\.(self_attn|mlp)\.\w+_proj")
    return get_peft_model(model, config)

# expect: pass
# 用正则表达式选中注意力和 MLP 里所有以 _proj 结尾的线性层，秩 4，rsLoRA 缩放（alpha / sqrt(r)）。
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, use_rslora=True, task_type="CAUSAL_LM",
                        target_modules=r".*\.(self_attn|mlp)\.\w+_proj")
    return get_peft_model(model, config)

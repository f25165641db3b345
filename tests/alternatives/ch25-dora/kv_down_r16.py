# expect: pass
# 注意力里只适配输出最窄的 k_proj、v_proj（GQA 下只有 KV 头的宽度），MLP 里适配 down_proj；秩 16。
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, use_dora=True, task_type="CAUSAL_LM",
                        target_modules=["k_proj", "v_proj", "down_proj"])
    return get_peft_model(model, config)

# expect: technique
# 半吊子：为了省显存只适配注意力（q、k、v、o），MLP 完全没有适配器，不满足"注意力和 MLP 都要适配"。
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, use_dora=True, task_type="CAUSAL_LM",
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    return get_peft_model(model, config)

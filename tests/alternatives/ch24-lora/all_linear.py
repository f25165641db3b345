# expect: pass
# 让 peft 一次选中除输出层以外的全部线性层（target_modules="all-linear"），不必自己写名字；秩 8。
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, config)

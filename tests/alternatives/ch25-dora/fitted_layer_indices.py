# expect: technique
# 照着看到的 4 层写死：layers_to_transform=[0, 1, 2, 3]。可见配置通过；隐藏配置的层数不同，
# 多出来的层既没有注意力适配器也没有 MLP 适配器。
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, use_dora=True, task_type="CAUSAL_LM",
                        target_modules=["q_proj", "v_proj", "down_proj"], layers_to_transform=[0, 1, 2, 3])
    return get_peft_model(model, config)

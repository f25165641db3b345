from peft import LoraConfig, get_peft_model


def prepare_model(model):
    """LoRA：冻结基座，只在注意力和 MLP 的每个线性层旁边加秩为 r 的 B·A 旁路。
    按名字选模块（名字来自 print(model)），层数不用管：每一层里同名的模块都会被适配。
    B 初始化为 0，所以一开始模型的输出与原模型完全相同。"""
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                        "gate_proj", "up_proj", "down_proj"])
    return get_peft_model(model, config)

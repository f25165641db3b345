from peft import LoraConfig, get_peft_model


def prepare_model(model):
    """DoRA：把权重分解成幅度 m 和方向 V/‖V‖，方向用 LoRA 更新，幅度单独训练。
    额外的显存与被适配层的输出维度之和成正比：注意力里挑 q、v，MLP 里只挑输出维度等于
    隐藏维度的 down_proj，不碰输出是中间维度的 gate/up。初始化时 m = ‖W‖、B = 0，
    模型的输出与原模型相同。"""
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, use_dora=True, task_type="CAUSAL_LM",
                        target_modules=["q_proj", "v_proj", "down_proj"])
    return get_peft_model(model, config)

from peft import PromptTuningConfig, get_peft_model


def prepare_model(model):
    """Prompt Tuning：在输入前面拼 16 个可训练的“虚拟 token”嵌入，模型本身全部冻结。
    维度和层数由 peft 从 model.config 读，不写死；可训练参数只有 16 × 隐藏维度个。"""
    config = PromptTuningConfig(num_virtual_tokens=16, task_type="CAUSAL_LM")
    return get_peft_model(model, config)

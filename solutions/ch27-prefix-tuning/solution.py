from peft import PrefixTuningConfig, get_peft_model


def prepare_model(model):
    """P-Tuning v2（深度提示）：每一层的注意力前面都拼 16 个可训练的 key/value 前缀，模型本身冻结。
    层数、KV 头数和每头维度由 peft 从 model.config 读。不用重参数化 MLP（prefix_projection=False），
    它的参数比前缀本身多得多。"""
    config = PrefixTuningConfig(num_virtual_tokens=16, prefix_projection=False, task_type="CAUSAL_LM")
    return get_peft_model(model, config)

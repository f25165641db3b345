# expect: pass
# 32 个虚拟 token，用词表里随机挑的词的嵌入初始化（SAMPLE_VOCAB），比纯随机初始化更接近真实输入的分布。
from peft import PromptTuningConfig, PromptTuningInit, get_peft_model


def prepare_model(model):
    config = PromptTuningConfig(num_virtual_tokens=32, prompt_tuning_init=PromptTuningInit.SAMPLE_VOCAB,
                                task_type="CAUSAL_LM")
    return get_peft_model(model, config)

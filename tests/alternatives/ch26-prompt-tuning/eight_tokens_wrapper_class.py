# expect: pass
# 不经过 get_peft_model，直接用 PeftModelForCausalLM 包装；8 个虚拟 token，随机初始化写明。
from peft import PeftModelForCausalLM, PromptTuningConfig, PromptTuningInit


def prepare_model(model):
    config = PromptTuningConfig(num_virtual_tokens=8, prompt_tuning_init=PromptTuningInit.RANDOM, task_type="CAUSAL_LM")
    return PeftModelForCausalLM(model, config)

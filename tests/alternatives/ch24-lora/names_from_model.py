# expect: pass
# 从模型本身找出每个解码层里线性层的短名字（q_proj、…、down_proj），再交给 LoRA；秩 16、alpha 32。
# 层数、宽度变了也一样：名字是读出来的，不是写死的。
import torch
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    names = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and ".layers." in name})
    config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=names, task_type="CAUSAL_LM")
    return get_peft_model(model, config)

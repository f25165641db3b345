# expect: pass
# 从模型本身挑：每个解码层里输出维度不超过隐藏维度的线性层（q、k、v、o 和 down_proj），
# 输出是中间维度的 gate/up 不适配。宽度变了也一样：维度是读出来的。
import torch
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    hidden = model.config.hidden_size
    names = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and ".layers." in name and m.out_features <= hidden})
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, use_dora=True, target_modules=names,
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)

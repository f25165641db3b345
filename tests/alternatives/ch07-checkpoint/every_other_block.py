# expect: pass
# 隔一个 block 做一次检查点：第 0、2、4… 个 block 包进 checkpoint（整个模块调用，非 reentrant），
# 其余照常保存激活值。用 Hugging Face 的开关逐层控制：先 gradient_checkpointing_enable，再把奇数层关掉。
import torch


def train_step(model, optimizer, batch, device):
    if not getattr(model, "_every_other", False):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for i, block in enumerate(model.transformer.h):
            block.gradient_checkpointing = i % 2 == 0
        model._every_other = True
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()

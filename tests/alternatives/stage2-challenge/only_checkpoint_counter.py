# expect: oom|too_much_memory
# 只用了一招：激活检查点让每个 block 只留输入，但反向重算一个 block 时它内部的 FP32 激活值、
# 以及整批 FP32 的 logits 和交叉熵临时张量仍然同时在显存里，超出这张卡。
import torch


def train_step(model, optimizer, batch, device):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()

# expect: oom|too_much_memory
# 少了一招：激活检查点和 8-bit AdamW 都用上了，但整批一次前向。激活值和优化器状态省下来了，
# logits 和交叉熵的临时张量（8192 个词的 FP32 logits、它的 log-softmax 和梯度）仍按整个 batch 算，
# 反向一开始就把虚拟显卡撑满。
import torch
import bitsandbytes as bnb


def train_step(model, optimizer, batch, device):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not hasattr(model, "_adamw8bit"):
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        model._adamw8bit = bnb.optim.AdamW8bit(model.parameters(), min_8bit_size=0, **hyper)
    opt = model._adamw8bit
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()

# expect: pass
# Hugging Face 自带的激活检查点，非 reentrant 实现（题目推荐的写法，与参考答案相同）。
import torch


def train_step(model, optimizer, batch, device):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()

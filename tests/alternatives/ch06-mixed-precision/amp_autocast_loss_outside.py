# expect: pass
# 另一种 API 和切法：用 torch.amp.autocast 只包住模型的前向（不传 labels），损失在 autocast 外面用 fp32 的
# logits 自己算（错位一格的交叉熵，模型自带的损失也是这样算的）。参数、梯度和优化器状态都保持 fp32。
import torch
import torch.nn.functional as F


def train_step(model, optimizer, batch, device):
    with torch.amp.autocast(device.type, dtype=torch.bfloat16):
        logits = model(input_ids=batch).logits
    logits = logits.float()
    labels = torch.nn.functional.pad(batch[:, 1:], (0, 1), value=-100)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()

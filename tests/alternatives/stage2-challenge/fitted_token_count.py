# expect: incorrect
# 拟合到可见配置的写法：激活检查点加分块交叉熵都对，但最后除以的 token 数照着可见配置写死成 1022
# （2 行 × 511 个预测位置）。可见配置上与参考答案一样；隐藏配置的批大小或序列长度不同，损失就错了。
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _part(h, w, y):
    return F.cross_entropy(h @ w.t(), y, reduction="sum")


def train_step(model, optimizer, batch, device):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    h = model.transformer(input_ids=batch).last_hidden_state
    h = h[:, :-1].reshape(-1, h.shape[-1])
    y = batch[:, 1:].reshape(-1)
    loss = 0
    for i in range(0, y.numel(), 256):
        loss = loss + checkpoint(_part, h[i:i + 256], model.lm_head.weight, y[i:i + 256], use_reentrant=False)
    loss = loss / 1022
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()

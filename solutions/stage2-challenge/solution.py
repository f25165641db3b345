import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _chunk_loss(h, w, y):
    return F.cross_entropy(h @ w.t(), y, reduction="sum")


def train_step(model, optimizer, batch, device, chunk=256):
    """两招组合，各对着一类显存：
    - 激活检查点（第 7 章）：每个 block 只留输入，反向时重算 block 内部；
    - 分块交叉熵（第 15 章）：每次只算 chunk 个 token 的 logits，每块也包进检查点，
      整批的 FP32 logits、log-softmax 和它们的梯度从不同时出现。"""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    h = model.transformer(input_ids=batch).last_hidden_state
    h = h[:, :-1].reshape(-1, h.shape[-1])          # position t predicts token t + 1
    y = batch[:, 1:].reshape(-1)
    w = model.lm_head.weight
    loss = 0
    for i in range(0, y.numel(), chunk):
        loss = loss + checkpoint(_chunk_loss, h[i:i + chunk], w, y[i:i + chunk], use_reentrant=False)
    loss = loss / y.numel()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()

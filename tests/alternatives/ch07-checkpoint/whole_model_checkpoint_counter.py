# expect: too_much_memory|technique
# 反例：把整个模型的前向包进一个 checkpoint。前向确实什么都不保存，可是反向一开始就把整个模型重算一遍，
# 重算时每个 block 又把全部激活值存下来，峰值和起始代码几乎一样：检查点要按 block 分段才省显存。
import torch
from torch.utils.checkpoint import checkpoint


def train_step(model, optimizer, batch, device):
    loss = checkpoint(lambda ids: model(input_ids=ids, labels=ids).loss, batch, use_reentrant=False)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()

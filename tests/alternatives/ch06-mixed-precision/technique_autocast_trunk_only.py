# expect: pass
# 只把主干放进 bf16 autocast：model.transformer（各个 block 的矩阵乘法）用 bf16 计算、保存 bf16 激活值；
# 输出层 lm_head 和损失在 autocast 外面用 fp32 算（输出层的输入先转回 fp32）。参数、梯度、优化器状态
# 都还是 fp32。错位一格的交叉熵把标签左移一格、末尾补 -100（忽略），不切 logits[:, :-1]（切片不连续，
# reshape 会把整份 fp32 logits 再复制一遍）；fp32 的 logits 也不存进变量：log_softmax 为反向只保存它的输出，
# 变量一直引用着 logits 的话，这份 fp32 logits 就要活到函数返回，白占显存。
import torch
import torch.nn.functional as F


def train_step(model, optimizer, batch, device):
    with torch.autocast(device.type, dtype=torch.bfloat16):
        hidden = model.transformer(input_ids=batch).last_hidden_state
    labels = F.pad(batch[:, 1:], (0, 1), value=-100).reshape(-1)
    loss = F.cross_entropy(model.lm_head(hidden.float()).flatten(0, 1), labels, ignore_index=-100)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()

# expect: pass
# bf16 自动混合精度的常见写法：前向的输出对象 out（带着 logits）作为局部变量一直活到这一步结束，
# 反向和优化器更新在 autocast 外面，返回 out.loss.item()。多活的只是一份 16 位的 logits。
import torch


def train_step(model, optimizer, batch, device):
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        out = model(input_ids=batch, labels=batch)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out.loss.item()

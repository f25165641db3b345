# expect: pass
# fp16 自动混合精度 + GradScaler（题目"延伸"里的做法）：fp16 指数范围小，损失先放大再反向，
# scaler.step 先把梯度缩回去（有 inf/nan 就跳过这一步），scaler.update 调整放大倍数。
# GradScaler 要跨步保留（它记着当前的倍数），第一次调用时创建、存在模型上。
import torch


def train_step(model, optimizer, batch, device):
    scaler = getattr(model, "_grad_scaler", None)
    if scaler is None:
        scaler = model._grad_scaler = torch.amp.GradScaler(device.type)
    with torch.autocast(device.type, dtype=torch.float16):
        loss = model(input_ids=batch, labels=batch).loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()

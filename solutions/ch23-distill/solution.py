import torch
import torch.nn.functional as F


def distill_step(student, teacher, optimizer, batch, device, temperature=2.0):
    """教师只做推理：在 no_grad 下前向，不保存激活值、不建计算图，反向也到不了教师，教师不会有梯度。"""
    teacher.eval()
    with torch.no_grad():
        teacher_logits = teacher(input_ids=batch).logits
    out = student(input_ids=batch, labels=batch)
    t = temperature
    vocab = out.logits.shape[-1]
    kd = F.kl_div(F.log_softmax(out.logits.reshape(-1, vocab) / t, dim=-1),
                  F.log_softmax(teacher_logits.reshape(-1, vocab) / t, dim=-1),
                  log_target=True, reduction="batchmean") * t * t
    loss = 0.5 * out.loss + 0.5 * kd
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()

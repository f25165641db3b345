# expect: too_much_memory
# 反例（抄了一行、放错了地方）：只给教师加了 eval()。它只切换 dropout 等层的行为，自动求导照样记录教师的
# 前向，反向照样一路算进教师、给教师的参数留下梯度，显存一点没省。
import torch
import torch.nn.functional as F


def distill_step(student, teacher, optimizer, batch, device, temperature=2.0):
    teacher.eval()
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

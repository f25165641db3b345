# expect: exception|incorrect
# 反例（放错了地方）：把整步都放进 no_grad，学生的前向也不记录了，损失没有计算图，反向直接报错。
import torch
import torch.nn.functional as F


def distill_step(student, teacher, optimizer, batch, device, temperature=2.0):
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

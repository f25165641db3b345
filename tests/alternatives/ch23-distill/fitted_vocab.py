# expect: incorrect|exception
# 针对看得到的配置：教师只做推理这一点是对的，但 KL 项改写时把词表大小写死成看得到的 4096。
# 隐藏配置换了词表，reshape 按错误的宽度切开 logits，损失就和起始代码不一样了。
import torch
import torch.nn.functional as F


def distill_step(student, teacher, optimizer, batch, device, temperature=2.0):
    teacher.eval()
    with torch.no_grad():
        teacher_logits = teacher(input_ids=batch).logits
    out = student(input_ids=batch, labels=batch)
    t = temperature
    kd = F.kl_div(F.log_softmax(out.logits.reshape(-1, 4096) / t, dim=-1),
                  F.log_softmax(teacher_logits.reshape(-1, 4096) / t, dim=-1),
                  log_target=True, reduction="batchmean") * t * t
    loss = 0.5 * out.loss + 0.5 * kd
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()

# expect: pass
# 另一种写法：教师的参数先冻结（requires_grad_(False)，只做一次），前向放在 inference_mode 里；
# 对 logit 蒸馏，KL 的目标是推理张量也能正常反向。损失公式与起始代码逐项相同。
import torch
import torch.nn.functional as F


def distill_step(student, teacher, optimizer, batch, device, temperature=2.0):
    if not getattr(teacher, "_frozen", False):
        teacher.requires_grad_(False)
        teacher.eval()
        teacher._frozen = True
    with torch.inference_mode():
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

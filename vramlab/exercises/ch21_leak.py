"""第 21 章 找出并修好显存泄漏（ch21-leak）.

Kind "train_step" with settings.learner_budget_mib: the learner's run is on a virtual card that the
leaky starter overflows after a few steps; the trusted starter runs without the budget and gives
the losses, the update and the baseline peak. cuBLAS workspaces are off at ci scale.

The starter logs two metrics and leaks through both, neither named anywhere the learner reads:
the mean entropy of the output distribution is summed as a tensor with its graph (the "total +=
loss" pattern: the log-softmax and its exp, 2 x B x S x V floats, stay saved for a backward that
never comes), and a forward hook on every MLP activation appends `output.abs().mean()` with its
graph (the GELU output, B x S x 4d floats per layer per step). At the visible scale (vocab 8192)
the entropy leak dominates `top_allocations`; the hidden case has a small vocabulary, more tokens
and more steps, so fixing the biggest symptom alone overflows there.

The cards leave an honest fix room for ordinary Python locals (issue 33: a fix that kept `logp`
alive during backward() overflowed the old 108 MiB hidden card and scored 0). They are sized from
the reserved peaks (what a card must hold: the caching allocator's segments, not just live bytes)
of the honest fixes in tests/alternatives/ch21-leak, measured with `vramlab.exercise_setup` and
no card: a logits-sized local alive through backward() costs a 20 MiB allocator segment more than
the reference (a 2 MiB request takes a new 20 MiB segment when no cached block fits). Each card
is that largest honest reserved peak plus room, and below what the leaks need (TARGET_NOTE).
"""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, Variation

STARTER = '''\
import torch


def train_step(model, optimizer, batch, device):
    """一步训练，顺带记录两个写日志用的监控量：MLP 激活值的平均幅度（每层一个数）和输出分布的平均熵。
    损失和参数更新都是对的。"""
    mon = _monitor(model)
    out = model(input_ids=batch, labels=batch)
    logp = torch.log_softmax(out.logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1).mean()
    mon["entropy_sum"] = mon["entropy_sum"] + entropy
    mon["steps"] += 1
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out.loss.item()


def _monitor(model):
    if not hasattr(model, "_monitor"):
        mon = {"mlp_act": [], "entropy_sum": 0.0, "steps": 0}

        def record(module, args, output):
            mon["mlp_act"].append(output.abs().mean())

        for block in model.transformer.h:
            block.mlp.act.register_forward_hook(record)
        model._monitor = mon
    return model._monitor
'''

TARGET_NOTE = ("Measured on the sim at ci scale (torch 2.13.0+cpu, 2026-12-05; vramlab.exercise_setup(id, _hidden=i) "
               "with the card removed, per-step max allocated / max reserved; then `vramlab grade` per file): visible "
               "(2 layers, d 256, vocab 8192, batch 4 x 128, 5 steps): the starter grows 36 MiB per step (entropy sum 32, "
               "hook 4); honest fixes peak at 137-169 MiB allocated and reserve at most 186 MiB (Categorical / probs + "
               "logp locals alive through backward; the reference 153.1 / 170); the hook-only fix reserves 218 MiB at "
               "step 2. Card 200 MiB: 14 MiB over the largest honest reservation, the leaks overflow it at step 2. Hidden "
               "(vocab 512, batch 8, 8 steps): honest fixes peak at 91.7-95.7 MiB and reserve at most 120 MiB (a "
               "logits-sized local alive through backward: one 20 MiB segment over the reference's 100); the entropy-"
               "only fix (hook leak, 8 MiB per step) reserves 140 MiB by step 4 and allocates 143.7 MiB at step 7. Card "
               "136 MiB: 16 MiB (13%) over the largest honest reservation; graded, the entropy-only fix overflows at "
               "step 4. Ratios (visible / hidden, target 0.8): reference 0.49 / 0.50, logp alive 0.49 / 0.51, "
               "Categorical 0.54 / 0.52, probs + logp 0.54 / 0.52, detached tensor sums 0.44 / 0.50.")

SPEC = ExerciseSpec(
    id="ch21-leak",
    chapter=21,
    title="OOM 排查：找出每一步都在涨的那块显存",
    task=(
        "`train_step(model, optimizer, batch, device)` 做一次参数更新并返回损失（Python `float`）。\n\n"
        "起始代码的损失和参数更新都是对的，还顺带记录了几个写日志用的监控量。可是评分器在一张**虚拟显卡**上"
        "连续调用它，跑不完就 OOM。请先**诊断**：找出是什么在涨、是谁还引用着它，要拿得出证据"
        "（本章讲过的几种工具都可以用）；再**修好**它。监控量可以保留，也可以换一种记法；"
        "损失和参数更新要与起始代码一致。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=4, seq=128, steps=5, warmup=1,
             settings=train_step.Settings(cublas_workspace=False, learner_budget_mib=200,
                                          config={"n_layer": 2, "n_embd": 256, "n_head": 4, "vocab_size": 8192}),
             hidden=(Variation(catches="a fix of the biggest leak only (the entropy sum, which dominates "
                                       "top_allocations at vocab 8192): with a small vocabulary, more tokens and more "
                                       "steps the hook's leak is the bigger one and overflows the card",
                               batch=8, steps=8, config={"vocab_size": 512}, settings={"learner_budget_mib": 136}),)),
    gpu=Scale(model="gpt2-small", batch=8, seq=512, steps=5, warmup=1,
              settings=train_step.Settings(learner_budget_mib=9216)),
    target_ratio=0.8,
    points=10,
    hints=(
        "连续调用几次 `train_step`，每次之后读一下已分配显存：稳定的训练每步结束时应该回到同一个数。"
        "它在涨吗？涨的那些张量是哪一类、在哪个模块里、由哪个算子分配的？",
        "一步结束以后，前向的激活值本该全部释放。还活着的那些，是谁引用着它们？"
        "一个连着计算图、却不属于损失的张量被长期留住时，图上为反向保存的张量会怎样？",
        "泄漏不止一处：修好最大的那一处之后，再量一次每步结束时的已分配显存，直到它不再增长。",
        "监控量只留 Python 数：在 `torch.no_grad()` 下计算，或者先 `.detach()`，再用 `.item()` 取出数值；"
        "钩子里也一样。",
    ),
    giveaways=(r"no_grad", r"\.detach\(\)", r"entropy\.item\(\)", r"mean\(\)\.item\(\)"),
)

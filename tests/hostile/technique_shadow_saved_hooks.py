# expect: technique
# exercise: ch07-checkpoint
# 伪造激活检查点：其实做的是梯度累积（每 2 个样本一个 micro-batch，峰值本来就低于目标），再用自己的
# saved_tensors_hooks 把评分器的挡在外面（只有最里面的一对钩子生效，旧评分器的 block 内保存字节数于是读成 0），
# unpack 里顺手调用一次 block 的子模块，让“反向中有 block 内的模块被执行”看起来像重算。激活值一个不少地
# 留在设备上。旧评分器（观察 saved_tensors_hooks 和模块钩子）上：方法判为检查点，通过。
# 现在：评分器在每次从前向进入反向时读设备上还留着的字节数，按样本数累计，和起始代码一样多：technique。
import torch

_probe_input = None


def _pack(t):
    return t


def _unpack(t):
    if _probe_input is not None:
        with torch.enable_grad():
            _block.ln_1(_probe_input)        # a block module "recomputed" during backward: nothing is
    return t


def train_step(model, optimizer, batch, device):
    global _probe_input, _block
    _block = model.transformer.h[0]
    _probe_input = torch.zeros(1, model.config.n_embd, device=batch.device)
    n = batch.shape[0]
    total = 0.0
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        for chunk in batch.split(2):
            part = model(input_ids=chunk, labels=chunk).loss * chunk.shape[0] / n
            part.backward()
            total += part.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total

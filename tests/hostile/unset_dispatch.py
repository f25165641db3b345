# expect: tamper
# pop the tracker off the dispatch stack with torch._C
import torch


def train_step(model, optimizer, batch, device):
    mode = torch._C._pop_torch_dispatch_stack(None)
    loss = model(input_ids=batch, labels=batch).loss
    torch._C._push_on_torch_dispatch_stack(mode)
    total = 0.0
    for chunk in batch.split(4):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / batch.shape[0])
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total

# expect: tamper
# run the work with all dispatch modes disabled
import torch
from torch.utils._python_dispatch import _disable_current_modes

def train_step(model, optimizer, batch, device):
    with _disable_current_modes():
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
    total = 0.0
    for chunk in batch.split(4):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / batch.shape[0])
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total

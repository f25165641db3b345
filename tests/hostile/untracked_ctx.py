# expect: tamper
# dev.untracked() around the forward
import torch


def train_step(model, optimizer, batch, device):
    with device.untracked():
        loss = model(input_ids=batch, labels=batch).loss
    total = 0.0
    for chunk in batch.split(4):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / batch.shape[0])
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total

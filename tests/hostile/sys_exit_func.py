# expect: exit
# sys.exit inside the function
import torch
import sys

def train_step(model, optimizer, batch, device):
    sys.exit(0)
    total = 0.0
    for chunk in batch.split(4):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / batch.shape[0])
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total

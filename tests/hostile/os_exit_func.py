# expect: crashed
# os._exit inside the function
import torch
import os

def train_step(model, optimizer, batch, device):
    os._exit(0)
    total = 0.0
    for chunk in batch.split(4):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / batch.shape[0])
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total

# expect: forbidden
# read the reference solution from the package
import torch
import os, vramlab

def train_step(model, optimizer, batch, device):
    print(open(os.path.join(os.path.dirname(vramlab.__file__), 'exercises', 'ch05_accumulation.py')).read()[:100])
    total = 0.0
    for chunk in batch.split(4):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / batch.shape[0])
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total

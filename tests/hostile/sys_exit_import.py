# expect: exit
# sys.exit at import
import torch
import sys
sys.exit(0)

def train_step(model, optimizer, batch, device):

    total = 0.0
    for chunk in batch.split(4):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / batch.shape[0])
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total

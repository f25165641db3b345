# expect: incorrect
# compute the losses but never update the parameters
import torch


def train_step(model, optimizer, batch, device):
    total = 0.0
    with torch.no_grad():
        for chunk in batch.split(4):
            total += model(input_ids=chunk, labels=chunk).loss.item() * (chunk.shape[0] / batch.shape[0])
    return total

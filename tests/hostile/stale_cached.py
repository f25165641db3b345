# expect: incorrect
# skip the work after the first call: return the cached loss, never step again
import torch

_cache = {}


def train_step(model, optimizer, batch, device):
    if "loss" in _cache:
        return _cache["loss"]
    total = 0.0
    for chunk in batch.split(4):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / batch.shape[0])
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _cache["loss"] = total
    return total

# expect: tamper
# monkeypatch StorageTracker.track (class of the tracker's base)
import torch
from vramlab.sim.tracker import StorageTracker

def train_step(model, optimizer, batch, device):
    StorageTracker.track = lambda self, *a, **k: None
    total = 0.0
    for chunk in batch.split(4):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / batch.shape[0])
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total

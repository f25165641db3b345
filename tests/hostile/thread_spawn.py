# expect: forbidden
# start a thread that keeps running
import torch
import threading

def train_step(model, optimizer, batch, device):
    threading.Thread(target=lambda: None).start()
    total = 0.0
    for chunk in batch.split(4):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / batch.shape[0])
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total

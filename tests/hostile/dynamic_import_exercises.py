# expect: forbidden|exception
# import the exercise specs dynamically
import torch
import importlib

def train_step(model, optimizer, batch, device):
    importlib.import_module('vramlab.' + 'exercises').get_exercise('ch05-accumulation').solution
    total = 0.0
    for chunk in batch.split(4):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / batch.shape[0])
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total

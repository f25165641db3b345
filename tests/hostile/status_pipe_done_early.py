# expect: crashed|tamper|forbidden|technique|too_much_memory|exception
# Reads the harness's argv (JOB RANK CTL_FD STATUS_FD), says "done" to the parent on the status pipe
# before the memory-heavy step, hoping the parent reads the peak early and trusts a lowered report.
# The parent reads the peak at "done", stops the process and kills the sandbox: the step never finishes.
import json
import os
import sys

import torch


def train_step(model, optimizer, batch, device):
    try:
        os.write(int(sys.argv[4]), (json.dumps({"event": "done"}) + "\n").encode())
    except (OSError, IndexError, ValueError):
        pass
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()

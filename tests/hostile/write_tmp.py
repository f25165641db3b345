# expect: forbidden|technique|too_much_memory
# write into /tmp: in the sandbox /tmp is a folder inside this grading's own folder, so the file never
# reaches the machine's /tmp (tests/test_grader.py checks /tmp/PWNED_by_hostile.txt does not exist);
# the step is the starter's, so the submission fails on memory if the write is not refused first
import torch


def train_step(model, optimizer, batch, device):
    try:
        open('/tmp/PWNED_by_hostile.txt', 'w').write('x')
    except OSError:
        pass
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()

"""Stage-2 exercises that are not "make train_step smaller" on one process (kinds call and
max_batch, and the 2-rank gloo runs): the reference solution passes, the starter fails, and the
typical wrong answers are refused with a reason, through the real isolated grader on the simulated
device at ci scale. (ch08-allreduce and ch10-zero, kind train_step on 2 ranks, run with the other
training exercises in tests/test_exercises.py.)"""
from __future__ import annotations

import pytest

from vramlab.exercises import get_exercise
from vramlab.grader import grade_source
from vramlab.grader.report import format_result

pytestmark = pytest.mark.slow       # starts processes: the full tier (make test), not make check


@pytest.mark.parametrize("exercise_id,starter_category", [
    ("ch09-tensor-parallel", "too_much_memory"), ("ch11-fragmentation", "too_much_memory"),
    ("ch12-eval-loop", "too_much_memory"), ("ch14-attention", "too_much_memory"), ("ch15-embedding-offload", "too_much_memory")])
def test_solution_passes_and_starter_fails(exercise_id, starter_category):
    spec = get_exercise(exercise_id)
    good = grade_source(exercise_id, spec.solution, reuse_baseline=True)
    assert good["passed"] and good["score"] == spec.points and good["correct"] is True, good["reason"]
    assert max([good["ratio"], *(good.get("hidden_ratios") or [])]) <= spec.target_ratio - 0.05                  # margin below the target
    assert "通过" in format_result(good)
    bad = grade_source(exercise_id, spec.starter, reuse_baseline=True)
    assert not bad["passed"] and bad["score"] == 0
    assert bad["category"] == starter_category, bad["reason"]
    assert bad["correct"] is True                                     # right answer, too costly
    assert bad["ratio"] > spec.target_ratio


def test_max_batch_solution_passes_and_starter_answers_too_small():
    """ch13: the learner writes the whole probe (OOM caught, cleaned up, a full step with the
    optimizer's lazily created state); the starter answers 1, which fits but is not the largest."""
    spec = get_exercise("ch13-max-batch")
    good = grade_source(spec.id, spec.solution, reuse_baseline=True)
    assert good["passed"] and good["correct"] is True, good["reason"]
    assert max([good["ratio"], *(good.get("hidden_ratios") or [])]) <= 0.95         # tries / allowed
    bad = grade_source(spec.id, spec.starter, reuse_baseline=True)
    assert not bad["passed"] and bad["category"] == "incorrect", bad["reason"]


def _variant(exercise_id: str, old: str, new: str) -> str:
    src = get_exercise(exercise_id).solution
    assert old in src, old
    return src.replace(old, new, 1)


WRONG = {
    # tensor parallel without the all_reduce: each rank returns only its partial sum
    "tp_no_allreduce": ("ch09-tensor-parallel", "    dist.all_reduce(y)                                         # 求和，得到完整输出\n", "",
                        "incorrect"),
    # one rank dies: the other is stopped and the reason names the rank (no wait for the timeout)
    "tp_rank_raises": ("ch09-tensor-parallel", "    rank, world = dist.get_rank(), dist.get_world_size()\n",
                       "    rank, world = dist.get_rank(), dist.get_world_size()\n"
                       "    if rank == 1:\n        raise RuntimeError('rank 1 坏了')\n", "exception"),
    # emptying the cache hides fragmentation for a moment: refused
    "frag_empty_cache": ("ch11-fragmentation", "        outputs[i] = h @ weight.T\n",
                         "        outputs[i] = h @ weight.T\n        del x, h\n        device.empty_cache()\n", "tamper"),
    # an OOM that is not caught ends the search
    "max_batch_uncaught": ("ch13-max-batch", "        except torch.OutOfMemoryError:\n", "        except ValueError:\n", "oom"),
    # off by one: the first size that does NOT fit
    "max_batch_off_by_one": ("ch13-max-batch", "    return good\n", "    return bad\n", "incorrect"),
    # detached output: no gradients reach q, k, v
    "attention_detached": ("ch14-attention", "    return torch.cat(outs, dim=-2)\n",
                           "    return torch.cat(outs, dim=-2).detach()\n", "incorrect"),
    # the result left in host memory
    "embed_on_host": ("ch15-embedding-offload", "    return device.to_device(rows)\n", "    return rows\n", "incorrect"),
    # host memory is allowed here, device memory off the meter is not
    "embed_untracked": ("ch15-embedding-offload", "    ids_host = device.to_host(ids)\n",
                        "    with device.untracked():\n        device.to_device(table)\n    ids_host = device.to_host(ids)\n",
                        "tamper"),
    # ... also from code that pretends to be the simulator (a module name is easy to fake; the
    # harness trusts code objects, not names)
    "embed_untracked_spoofed": ("ch15-embedding-offload", "    ids_host = device.to_host(ids)\n",
                                "    ns = {'__name__': 'vramlab.sim.device'}\n"
                                "    exec('def f(d, t):\\n    with d.untracked():\\n        return d.to_device(t)\\n', ns)\n"
                                "    ns['f'](device, table)\n    ids_host = device.to_host(ids)\n", "tamper"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_wrong_answers_are_refused(name):
    exercise_id, old, new, category = WRONG[name]
    r = grade_source(exercise_id, _variant(exercise_id, old, new), reuse_baseline=True)
    assert not r["passed"] and r["score"] == 0
    assert r["category"] == category, r["reason"]
    if name == "tp_rank_raises":
        assert "rank 1" in r["reason"] and r["seconds"] < 100


CHUNKED_ATTENTION = '''
import math

import torch
from torch.utils.checkpoint import checkpoint


def _block(q, k, v, start, softcap):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = softcap * torch.tanh(scores / softcap)
    rows = torch.arange(start, start + q.shape[-2], device=q.device)[:, None]
    cols = torch.arange(k.shape[-2], device=q.device)[None, :]
    return torch.softmax(scores.masked_fill(cols > rows, float("-inf")), dim=-1) @ v


def attention(q, k, v, softcap):
    outs = []
    for start in range(0, q.shape[-2], 64):
        end = start + 64
        outs.append(checkpoint(_block, q[..., start:end, :], k[..., :end, :], v[..., :end, :], start, softcap,
                               use_reentrant=False))
    return torch.cat(outs, dim=-2)
'''

SDPA_ONLY = '''
import torch.nn.functional as F


def attention(q, k, v, softcap):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
'''


def test_sdpa_alone_is_wrong_and_query_blocks_with_checkpoints_pass():
    """ch14's scores are soft-capped (Gemma 2), which no fused SDPA kernel computes: one SDPA call
    is refused as incorrect, query blocks recomputed in backward pass (another block size than the
    reference's 128)."""
    r = grade_source("ch14-attention", CHUNKED_ATTENTION, reuse_baseline=True)
    assert r["passed"], r["reason"]
    assert r["ratio"] <= get_exercise("ch14-attention").target_ratio - 0.1
    wrong = grade_source("ch14-attention", SDPA_ONLY, reuse_baseline=True)
    assert not wrong["passed"] and wrong["category"] == "incorrect", wrong["reason"]
    assert "软上限" in wrong["reason"]

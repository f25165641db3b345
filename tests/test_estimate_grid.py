"""The estimator against the simulated device over every option it offers (vramlab.estimate_grid).

153 cases cover every pair of option values on any two axes — precision, method (full fine-tuning,
LoRA on peft's default targets / q,k,v,o / all linear layers, QLoRA on two of those), activation
checkpointing, optimizer, activation offload, accumulation, attention kernel, dropout, AdamW's
foreach — every triple of precision × method × checkpointing × optimizer and of regime × attention
× offload × checkpointing, on 2-layer twins of every sample config (GPT-2, BERT, Llama, Mistral,
Qwen2 with an untied and a tied head, Mixtral), in two regimes: batch 1 × 64 tokens (weights,
gradients and optimizer state dominate) and batch 4 × up to 2048 tokens with an 8k vocabulary
(activations dominate). Each estimate (`device="sim"`, see estimate.SIM_DEVICE_NOTES) must be within
3% of the steady-state peak the simulated device measures under FakeTensorMode, except the cases in
KNOWN, each with the deviation measured when it was listed. ZeRO is not on the grid: the simulated
device runs one process; `test_zero_shards_exactly` checks its closed form instead.

The full-size sample configs run the same grid with `python -m vramlab.estimate_grid` (slow).
"""
from __future__ import annotations

import itertools
import re

import pytest

from vramlab import estimate as E
from vramlab import estimate_grid as G
from vramlab.workload import Workload

TOLERANCE = G.TOLERANCE

# Cases outside 3% on the 2-layer twins, each with its deviation when listed (estimate / simulated
# device - 1) and why. Empty as of 2026-12-06 (torch 2.13.0+cpu; worst case 2.7%). The 15 listed on
# 2026-12-05 (LoRA and QLoRA in the activations regime, -7.8% to +6.1%) had these mechanisms, now in
# the estimator's walk (estimate._Forward, _backward_peak):
# - the forward counted only what autograd saves, not what Python locals keep alive: the block's
#   input and residual, the sublayer's normalised input, q/k/v, the returned attention weights,
#   peft's fp32 copy of x and the base output during the adapter branch, a module's argument, the
#   model's inputs_embeds (and the eager causal mask); a recomputation's forward is the same walk;
# - transformers' gradient_checkpointing_enable() calls enable_input_require_grads(): under LoRA
#   with full checkpointing the embeddings' output is a leaf that requires grad, held all step,
#   and the first block saves like every other;
# - GPT-2's eager attention: matmul copies the strided q/k/v views (saved instead of c_attn's
#   output) and SplitBackward joins their gradients only after the attention's backward;
#   attention dropout runs in the value's dtype (GPT-2) or the softmax's (BERT);
# - the LM head's saved tensors were counted during a block's backward, after its node freed them;
# - Mixtral's MoE was one node: now the down matmul and weighting, SwiGLU, and gather + gate_up.
KNOWN: dict[str, float] = {}


def test_grid_covers_every_option_and_every_pair():
    cases = G.covering_cases()
    assert cases == G.covering_cases(), "the sample is deterministic"
    rows = [{a: getattr(c, a) for a in G.AXES} for c in cases]
    for axis, values in G.AXES.items():
        assert {r[axis] for r in rows} == set(values), axis
    for a, b in itertools.combinations(G.AXES, 2):
        seen = {(r[a], r[b]) for r in rows}
        for pair in itertools.product(G.AXES[a], G.AXES[b]):
            if G.feasible({a: pair[0], b: pair[1]}):
                assert pair in seen, (a, b, pair)
    for group in G.TRIPLES:
        for combo in itertools.combinations(group, 3):
            seen = {tuple(r[n] for n in combo) for r in rows}
            for t in itertools.product(*(G.AXES[n] for n in combo)):
                if G.feasible(dict(zip(combo, t))):
                    assert t in seen, (combo, t)
    assert set(KNOWN) <= {c.label() for c in cases}, "KNOWN names cases of the grid"


def test_every_twin_builds_and_every_case_is_a_valid_workload():
    for c in G.covering_cases():
        w = G.workload(c)
        assert w.lora_targets == c.lora_targets and w.qlora == c.qlora
        assert E.estimate(w).total_bytes > 0


@pytest.fixture(scope="module")
def grid_rows():
    return G.run(G.covering_cases())


@pytest.mark.slow
def test_estimate_within_3_percent_of_the_simulated_device(grid_rows):
    problems, within = [], 0
    for r in grid_rows:
        label = G.Case(**{k: r[k] for k in G.AXES}).label()
        assert r["status"] == "ok", (label, r.get("error"))
        err = r["error_rel"]
        if label in KNOWN:
            # still off (else take it out of KNOWN), and no further off than when it was listed
            assert abs(err) > TOLERANCE, f"{label}: now within {TOLERANCE:.0%} ({err:+.3f}); drop it from KNOWN"
            if abs(err) > abs(KNOWN[label]) + 0.005:
                problems.append(f"{label}: {err:+.3f} (listed at {KNOWN[label]:+.3f})")
        elif abs(err) > TOLERANCE:
            problems.append(f"{label}: {err:+.3f}")
        else:
            within += 1
    assert not problems, "\n".join(problems)
    assert within == len(grid_rows) - len(KNOWN) >= 135


@pytest.mark.slow
def test_worst_error_per_option_is_reported(grid_rows, capsys):
    worst = G.worst_per_option(grid_rows)
    assert set(worst) == set(G.AXES)
    for axis, values in G.AXES.items():
        assert set(worst[axis]) == {str(v) for v in values}, axis
    G.report(grid_rows)
    out = capsys.readouterr().out
    assert re.search(r"\d+/153 在 ±3% 以内", out) and "各选项的最大偏差" in out


def test_zero_shards_exactly():
    """ZeRO (not on the grid: the simulated device runs one process), mixed precision with AdamW on
    8 GPUs: 16-bit weights and gradients, fp32 master weights + m + v (K = 12); stage 1 shards the
    state, 2 also the gradients, 3 also the weights (Rajbhandari et al. 2020, Sec. 5)."""
    base = dict(model="llama-1b", batch=1, seq=512, precision="bf16-mixed", gpus=8)
    P, n, ws = E.param_count("llama-1b"), 8, 2 * E.CUBLAS_WORKSPACE_BYTES
    for stage in (1, 2, 3):
        e = E.estimate(Workload(**base, zero=stage))
        weights = 2 * P // (n if stage == 3 else 1)
        grads = 2 * P // (n if stage >= 2 else 1)
        state = 12 * P // n
        temp = 4 * P // n                  # foreach AdamW's sqrt(v), sharded with the state
        assert e.phases["optimizer_step"] == weights + grads + state + temp + ws, stage


def test_sim_device_notes_only_add():
    """device="sim" adds the simulated device's known differences from CUDA, never removes bytes."""
    for c in G.covering_cases()[::5]:
        w = G.workload(c)
        assert E.estimate(w, device="sim").total_bytes >= E.estimate(w).total_bytes, c.label()


def test_record_figures_summarise_the_grid():
    """`python -m vramlab.estimate_grid --record`: cases, how many within 3%, the worst error, and
    per axis the worst of each option (what the performance page shows)."""
    cases = G.covering_cases()[:3]
    rows = [{**{k: getattr(c, k) for k in G.AXES}, "status": "ok", "error_rel": e}
            for c, e in zip(cases, (0.01, -0.05, 0.002))]
    fig = G.record_figures(rows, twin=False)
    assert fig["组合"] == 3 and fig["±3% 以内"] == 2 and fig["最大偏差"] == "-5.0%"
    assert fig["后端"] == "sim (FakeTensorMode)" and fig["模型"] == "完整示例配置"
    assert set(G.AXES) <= set(fig)
    assert f"{cases[1].precision} -5.0%" in fig["precision"]

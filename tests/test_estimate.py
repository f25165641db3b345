"""Tests for vramlab.estimate: the ZeRO paper's numbers, every H200 reference row, sanity properties.

Run `python -m pytest tests/test_estimate.py -s` to print the comparison with the reference table.
"""
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from vramlab import estimate as E
from vramlab.workload import Workload, WorkloadError, from_reference_name

MiB = 1024**2
TABLE = Path(__file__).resolve().parents[1] / "vramlab" / "data" / "h200_gpt2_peaks.md"


def _reference_rows():
    """Parse the markdown table ourselves: (name, steady peak MiB, trainable params)."""
    rows, header = [], None
    for line in TABLE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if re.fullmatch(r"[-: ]+", cells[0]):
            continue
        if header is None:
            header = cells
            continue
        rows.append((cells[0].split()[0], float(cells[header.index("steady peak MiB")].replace(",", "")),
                     int(cells[header.index("trainable params")].replace(",", ""))))
    return rows


ROWS = _reference_rows()


def test_table_parsed():
    assert len(ROWS) >= 26
    assert ROWS[0][:2] == ("small_fp32_adamw_b8_s512", 7925.0)


# --- 1. ZeRO paper (Rajbhandari et al. 2020, Fig. 1) ------------------------------------------------

@pytest.mark.parametrize("stage,gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_example(stage, gb):
    got = E.zero_model_state_bytes(int(7.5e9), stage, 64, k=12) / 1e9
    assert abs(got - gb) <= 0.05, (stage, got)


# --- 2. every H200 reference row within 10 % ---------------------------------------------------------

@pytest.mark.parametrize("name,ref_mib,_", ROWS, ids=[r[0] for r in ROWS])
def test_reference_row_within_10_percent(name, ref_mib, _):
    est = E.estimate(from_reference_name(name)).total_bytes / MiB
    assert abs(est / ref_mib - 1) < 0.10, f"{name}: estimate {est:.0f} MiB vs measured {ref_mib:.0f} MiB"


TRAINING_ROWS = [r for r in ROWS if not from_reference_name(r[0]).inference]   # inference trains nothing


@pytest.mark.parametrize("name,_,trainable", TRAINING_ROWS, ids=[r[0] for r in TRAINING_ROWS])
def test_reference_trainable_params(name, _, trainable):
    assert E.estimate(from_reference_name(name)).trainable_params == trainable


def test_print_comparison_table():
    print(f"\n{'row':45s} {'ref MiB':>9s} {'est MiB':>9s} {'ratio':>6s}")
    worst = 0.0
    for name, ref, _ in ROWS:
        est = E.estimate(from_reference_name(name)).total_bytes / MiB
        worst = max(worst, abs(est / ref - 1))
        print(f"{name:45s} {ref:9.0f} {est:9.0f} {est / ref:6.3f}")
    print(f"worst deviation: {worst:.1%}")
    assert worst < 0.10


# --- 3. sanity properties ------------------------------------------------------------------------

BASE = Workload(model="gpt2-small", batch=8, seq=512)


def total(**changes):
    return E.estimate(replace(BASE, **changes)).total_bytes


def test_monotone_in_batch_and_seq():
    batches = [total(batch=b) for b in (1, 2, 4, 8, 16)]
    seqs = [total(seq=s) for s in (64, 128, 256, 512, 1024)]
    assert batches == sorted(batches) and len(set(batches)) == len(batches)
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_checkpointing_reduces_activations():
    none = E.estimate(BASE)
    full = E.estimate(replace(BASE, checkpointing="full"))
    eager = replace(BASE, attention="eager", dropout=0.1)
    assert E.activation_bytes(replace(BASE, checkpointing="full")) < E.activation_bytes(BASE) / 10
    assert full.total_bytes < none.total_bytes
    assert E.activation_bytes(replace(eager, checkpointing="selective")) < E.activation_bytes(eager)


def test_lora_params_and_no_base_grads():
    assert E.lora_params("gpt2-small", 8) == 294_912
    e = E.estimate(replace(BASE, lora_rank=8))
    assert e.trainable_params == 294_912 and e.params == 124_439_808
    assert e.breakdown["gradients"] < MiB and e.breakdown["optimizer_state"] < 3 * MiB
    assert E.activation_bytes(replace(BASE, lora_rank=8)) > 0.5 * E.activation_bytes(BASE)


def test_qlora_shrinks_base_weights():
    w = replace(BASE, lora_rank=8, precision="bf16")
    q = E.estimate(w, qlora=True)
    assert q.breakdown["parameters"] < E.estimate(w).breakdown["parameters"]
    assert abs(E.qlora_weight_bytes(1_000_000) / 1_000_000 - 4.127 / 8) < 1e-3
    with pytest.raises(WorkloadError):
        E.estimate(BASE, qlora=True)


def test_zero_stages_never_raise_per_device_bytes():
    for precision in ("fp32", "bf16-mixed"):
        w = replace(BASE, model="gpt2-medium", gpus=8, precision=precision)
        totals = [E.estimate(replace(w, zero=z)).total_bytes for z in (1, 2, 3)]
        states = [E.zero_model_state_bytes(355_000_000, z, 8) for z in (0, 1, 2, 3)]
        assert totals == sorted(totals, reverse=True), (precision, totals)
        assert states == sorted(states, reverse=True)


def test_accumulation_far_below_full_batch():
    accum = total(batch=8, accum=4)
    assert accum < 0.4 * total(batch=32)
    assert accum > total(batch=8)          # gradients persist between micro-steps


def test_optimizers_and_precisions_order():
    adamw, sgdm, sgd = total(), total(optimizer="sgdm"), total(optimizer="sgd")
    assert sgd < sgdm < adamw
    assert total(optimizer="adafactor") < sgdm
    assert total(optimizer="adamw8bit") < adamw
    assert total(precision="bf16") < total(precision="bf16-mixed") < total()


def test_eager_adds_quadratic_scores_and_offload_frees_activations():
    assert total(attention="eager", seq=1024) - total(seq=1024) > 3 * (total(attention="eager") - total())
    assert E.estimate(replace(BASE, offload="activations")).breakdown["activations"] == 0


def test_korthikanti_formula_reproduced_per_tensor():
    """16-bit, dropout, eager, single-kernel GeLU: the per-tensor count is exactly sbh(34 + 5as/h)."""
    w = Workload(model="gpt2-small", batch=4, seq=256, precision="fp16", attention="eager", dropout=0.1)
    per_tensor = sum(b for name, b in E.saved_per_block(w, fused_gelu=True) if "mean/rstd" not in name)
    assert per_tensor == E.korthikanti_layer_bytes(256, 4, 768, 12)
    # vramlab's selective checkpointing recomputes the whole attention module (chapter 7's
    # tutorial), so it keeps less than Korthikanti's 34·sbh: LayerNorm inputs 2 + 2, the module's
    # input 2 (kept by the checkpoint, not saved), c_fc input 2, GeLU input 8, c_proj input 8,
    # MLP dropout mask 1 = 25·sbh
    sel = replace(w, checkpointing="selective")
    per_tensor_sel = sum(b for name, b in E.saved_per_block(sel, fused_gelu=True) if "mean/rstd" not in name)
    sbh = 256 * 4 * 768
    assert per_tensor_sel + 2 * sbh == 25 * sbh < E.korthikanti_layer_bytes(256, 4, 768, 12, selective=True)


def test_closed_form_param_counts():
    known = {"gpt2-small": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-xl": 1_557_611_200,
             "bert-base": 109_514_298, "llama-7b": 6_738_415_616, "llama-1b": 1_235_814_400,
             "llama-tiny": 625_280, "moe-tiny": 1_148_544, "bert-tiny": 611_456}
    for name, n in known.items():
        assert E.param_count(name) == n, name


def test_inference_and_kv_cache():
    e = E.estimate_inference("gpt2-small", 8, 512, "fp32", kv_cache=False)
    assert e.breakdown["gradients"] == e.breakdown["optimizer_state"] == 0
    kv = E.kv_cache_bytes("llama-7b", 1, 4096, "bf16")
    assert kv == 2 * 32 * 4096 * 32 * 128 * 2                     # 2 GiB for Llama-2-7B at 4k
    assert E.kv_cache_bytes("llama-tiny-mqa", 1, 512) * 2 == E.kv_cache_bytes("llama-tiny", 1, 512)
    with_kv = E.estimate_inference("llama-7b", 1, 4096, "bf16", kv_cache=True)
    assert with_kv.breakdown["activations"] == kv


def test_other_families_estimate():
    for model in ("bert-base", "llama-7b", "llama-1b", "moe-tiny"):
        for ck in ("none", "full", "selective"):
            e = E.estimate(Workload(model=model, batch=2, seq=256, precision="bf16-mixed", checkpointing=ck,
                                    attention="eager", dropout=0.1))
            assert e.total_bytes > e.params * 4


def test_breakdown_shape_and_json():
    e = E.estimate(BASE)
    assert tuple(e.breakdown) == E.KEYS
    assert e.total_bytes == sum(e.breakdown.values())
    assert all(k in e.notes for k in E.KEYS)
    assert "8 字节/参数" in e.notes["optimizer_state"]
    d = json.loads(json.dumps(e.to_dict()))
    assert set(d) >= {"total_bytes", "breakdown", "notes", "workload", "params", "trainable_params"}
    assert list(d["breakdown"]) == list(E.KEYS)


@pytest.mark.slow
def test_no_torch_at_import():
    import subprocess
    code = "import sys, vramlab.estimate as E; E.estimate(E.Workload()); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False", out.stderr


# --- 4. bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [dict(batch=0), dict(optimizer="lion"), dict(model="gpt5"),
                                 dict(zero=2, gpus=1), dict(seq=4096), dict(dropout=1.5)])
def test_invalid_workload_raises_chinese_error(bad):
    with pytest.raises(WorkloadError) as err:
        E.estimate(replace(BASE, **bad))
    assert re.search(r"[\u4e00-\u9fff]", str(err.value))

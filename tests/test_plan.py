"""`--config` (a local config.json as a model), `vramlab plan` and its cost model."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from vramlab import estimate as E
from vramlab import hfconfig as H
from vramlab import plan as P
from vramlab.cli import main
from vramlab.workload import Workload, WorkloadError

CJK = re.compile(r"[\u4e00-\u9fff]")
SAMPLES = {p.stem: p for p in H.sample_configs()}

# parameter counts published with the models (the model cards' totals, rounded there) are matched
# exactly here by the closed form, which tests/test_estimate.py checks against transformers
KNOWN_PARAMS = {"llama-3.1-8b": 8_030_261_248, "mistral-7b-v0.1": 7_241_732_096,
                "mixtral-8x7b-v0.1": 46_702_792_704, "qwen2.5-7b": 7_615_487_488,
                "gpt2-medium": 354_823_168, "bert-base-uncased": 109_514_298}


def small_llama(tmp_path, name="small", **over) -> Path:
    """A tiny Llama-style config.json in tmp_path/<name>/ (its preset: cfg:<name>)."""
    cfg = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=256, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, intermediate_size=512, vocab_size=1024,
               max_position_embeddings=1024, tie_word_embeddings=False, hidden_act="silu")
    cfg.update(over)
    path = tmp_path / name / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


# --- config.json -> Preset ------------------------------------------------------------------------

def test_sample_configs_are_the_published_models():
    assert set(SAMPLES) == set(KNOWN_PARAMS)
    families = {}
    for stem, path in SAMPLES.items():
        p = H.load_config(path)
        assert p.name == f"cfg:{stem}"
        assert E.param_count(p) == KNOWN_PARAMS[stem], stem
        families[stem] = p.family
    assert families == {"llama-3.1-8b": "llama", "mistral-7b-v0.1": "llama", "qwen2.5-7b": "llama",
                        "mixtral-8x7b-v0.1": "mixtral", "gpt2-medium": "gpt2", "bert-base-uncased": "bert"}
    llama = H.load_config(SAMPLES["llama-3.1-8b"])
    assert (llama.kv_heads, llama.heads, llama.config["tie_word_embeddings"]) == (8, 32, False)
    assert H.load_config(SAMPLES["llama-3.1-8b"]).fake_only and not H.load_config(SAMPLES["bert-base-uncased"]).fake_only
    assert "129,024" in H.load_config(SAMPLES["qwen2.5-7b"]).note      # the q/k/v biases it leaves out


def test_config_preset_equals_the_builtin_preset():
    """gpt2-medium's config.json and vramlab's own gpt2-medium preset describe one model."""
    p = H.load_config(SAMPLES["gpt2-medium"])
    for kw in (dict(), dict(precision="bf16-mixed", checkpointing="full"), dict(lora_rank=8)):
        a = E.estimate(Workload(model=p.name, batch=4, seq=512, **kw))
        b = E.estimate(Workload(model="gpt2-medium", batch=4, seq=512, **kw))
        assert a.total_bytes == b.total_bytes and a.breakdown == b.breakdown


def test_folder_and_tied_embeddings(tmp_path):
    path = small_llama(tmp_path, "tied", tie_word_embeddings=True)
    p = H.load_config(path.parent)                       # the folder, not the file
    assert p.name == "cfg:tied"
    untied = H.preset_from_config(dict(json.loads(path.read_text()), tie_word_embeddings=False))
    assert E.param_count(untied) - E.param_count(p) == 1024 * 256


def test_same_name_different_config_does_not_replace(tmp_path):
    a = H.load_config(small_llama(tmp_path, "twice"))
    (tmp_path / "twice" / "config.json").write_text(json.dumps(dict(
        json.loads((tmp_path / "twice" / "config.json").read_text()), intermediate_size=768)))
    b = H.load_config(tmp_path / "twice")
    assert a.name == "cfg:twice" and b.name.startswith("cfg:twice-")
    assert a.ffn_hidden == 512 and b.ffn_hidden == 768


@pytest.mark.parametrize("content, words", [
    ('{"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}', ["t5", "不支持"]),
    ('{"hidden_size": 8}', ["model_type"]),
    ('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2}', ["缺少", "intermediate_size", "vocab_size"]),
    ('{"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, '
     '"intermediate_size": 128, "vocab_size": 100}', ["num_local_experts", "num_experts_per_tok"]),
    ('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, '
     '"intermediate_size": 128, "vocab_size": 100, "hidden_act": "gelu"}', ["hidden_act", "silu"]),
    ('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, '
     '"intermediate_size": 128, "vocab_size": 100, "attention_bias": true}', ["attention_bias"]),
    ('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, '
     '"num_key_value_heads": 3, "intermediate_size": 128, "vocab_size": 100}', ["num_key_value_heads"]),
    ('{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 64, '
     '"activation_function": "relu"}', ["activation_function", "gelu_new"]),
    ('{"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, '
     '"intermediate_size": 128, "vocab_size": 100, "type_vocab_size": 1}', ["type_vocab_size"]),
    ('{"model_type": "llama", "hidden_size": "64"}', ["hidden_size"]),
    ('[1, 2]', ["JSON 对象"]),
    ('{"model_type": ', ["JSON"]),
])
def test_unsupported_configs_get_a_chinese_error_naming_the_field(tmp_path, content, words):
    path = tmp_path / "config.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(H.ConfigError) as err:
        H.load_config(path)
    msg = str(err.value)
    assert CJK.search(msg)
    for w in words:
        assert w in msg, (w, msg)


def test_missing_file_and_empty_folder(tmp_path):
    with pytest.raises(H.ConfigError, match="找不到"):
        H.load_config(tmp_path / "nope.json")
    with pytest.raises(H.ConfigError, match="没有 config.json"):
        H.load_config(tmp_path)


# --- the command line ------------------------------------------------------------------------------

def test_cli_estimate_with_config(capsys):
    assert main(["estimate", "--config", str(SAMPLES["llama-3.1-8b"]), "--batch", "1", "--seq", "4096",
                 "--precision", "bf16", "--lora-rank", "16", "--checkpointing", "full", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["workload"]["model"] == "cfg:llama-3.1-8b"
    assert d["params"] == KNOWN_PARAMS["llama-3.1-8b"]
    w = Workload(model="cfg:llama-3.1-8b", batch=1, seq=4096, precision="bf16", lora_rank=16, checkpointing="full")
    assert d["total_bytes"] == E.estimate(w).total_bytes


def test_cli_config_errors_exit_2_in_chinese(tmp_path, capsys):
    (tmp_path / "config.json").write_text('{"model_type": "whisper"}')
    assert main(["estimate", "--config", str(tmp_path), "--json"]) == 2
    out = capsys.readouterr()
    assert json.loads(out.out)["error"] == "bad_arguments" and "whisper" in out.err
    assert main(["measure", "--config", str(SAMPLES["llama-3.1-8b"]), "--batch", "1", "--seq", "64"]) == 2
    assert "--fake" in capsys.readouterr().err          # 8B: only under FakeTensorMode


def test_cli_measure_fake_and_trace_with_config(tmp_path, capsys):
    path = small_llama(tmp_path, "measured")
    assert main(["measure", "--config", str(path), "--batch", "2", "--seq", "128", "--backend", "sim", "--fake",
                 "--precision", "bf16", "--steps", "1", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["workload"]["model"] == "cfg:measured" and m["fake"]
    w = Workload(model="cfg:measured", batch=2, seq=128, precision="bf16")
    assert abs(E.estimate(w).total_bytes / m["peak_bytes"] - 1) < 0.03
    out = tmp_path / "trace.json"
    assert main(["trace", "--config", str(path), "--batch", "2", "--seq", "64", "--steps", "1", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["source"]["workload"]["model"] == "cfg:measured"


# --- simulated device: what a GPU does with grouped-query attention ----------------------------------

def test_fake_sim_does_not_materialise_a_mask_for_gqa(tmp_path):
    """Under FakeTensorMode transformers cannot read the position ids, assumes packed sequences and
    builds an S x S mask, which makes a GQA model repeat K and V per query head. The simulated device
    must skip that check as a GPU does; then the estimate (no repeat) matches within 1%."""
    path = small_llama(tmp_path, "gqa", hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                       num_key_value_heads=1, intermediate_size=1024)
    p = H.load_config(path)
    w = Workload(model=p.name, batch=4, seq=1024, precision="bf16", lora_rank=8)
    sim = P.run_on_sim(w, None)
    # 4 layers x 2 (k, v) x 7 repeated heads x 64 x 4096 tokens x 2 bytes = 29 MiB the mask path would add
    assert abs(E.estimate(w).total_bytes / sim["peak_bytes"] - 1) < 0.01


# --- cost model ----------------------------------------------------------------------------------

def test_cost_model_follows_its_sources():
    p = H.load_config(SAMPLES["llama-3.1-8b"])
    hw = P.Hardware()
    base = Workload(model=p.name, batch=1, seq=2048, precision="bf16-mixed", accum=4)
    c = P.step_cost(P.Candidate(base), p, hw)
    tokens = 4 * 2048
    n = P.active_matmul_params(p)
    attn = 2 * p.n_layers * 2048 * p.hidden
    assert c["compute"] == pytest.approx(tokens * 3 * (2 * n + attn) / (hw.bf16_tflops * 1e12))   # 6N (Kaplan)
    full = P.step_cost(P.Candidate(replace(base, checkpointing="full")), p, hw)
    assert full["recompute"] == pytest.approx(c["compute"] / 3)                                    # +1 forward
    lora = P.step_cost(P.Candidate(replace(base, lora_rank=16)), p, hw)
    assert 0.6 < lora["compute"] / c["compute"] < 0.7                                              # 4N of 6N
    fp32 = P.step_cost(P.Candidate(replace(base, precision="fp32")), p, hw)
    assert fp32["compute"] == pytest.approx(2 * c["compute"])
    one = replace(base, accum=1, gpus=4, batch=1)
    z0 = P.step_cost(P.Candidate(one), p, hw)["communication"]
    z3 = P.step_cost(P.Candidate(replace(one, zero=3)), p, hw)["communication"]
    assert z3 / z0 == pytest.approx(1.5)                                                           # ZeRO Sec. 7
    off = P.step_cost(P.Candidate(replace(base, offload="activations")), p, hw)["offload"]
    assert off == pytest.approx(2 * 4 * E.activation_bytes(base, p) / (hw.pcie_gbps * 1e9))
    moe = H.load_config(SAMPLES["mixtral-8x7b-v0.1"])
    assert P.active_matmul_params(moe) < 0.3 * E.matmul_weight_params(moe)                         # top-2 of 8


# --- plan ----------------------------------------------------------------------------------------

def test_plan_finds_fitting_configurations_on_a_small_card(tmp_path):
    p = H.load_config(small_llama(tmp_path))
    card = (700 + 160) * 2**20             # the CUDA context + 160 MiB
    plan = P.make_plan(p, card, seq=512, global_batch=16, verify=False)
    recs = plan["recommendations"]
    assert recs and plan["fitting"] < plan["searched"]
    assert recs[0]["cost"]["total"] == min(r["cost"]["total"] for r in recs)
    assert len({r["method"] for r in recs}) > 1            # the fastest of each method comes first
    for method in {r["method"] for r in recs}:             # then, per method, a Pareto front:
        mine = [r for r in recs if r["method"] == method]  # slower only if it needs less memory
        assert [r["cost"]["total"] for r in mine] == sorted(r["cost"]["total"] for r in mine)
        assert [r["need_bytes"] for r in mine] == sorted((r["need_bytes"] for r in mine), reverse=True)
    for r in recs:
        assert r["need_bytes"] <= plan["usable_bytes"]
        assert r["need_bytes"] >= r["estimate_bytes"]
        w = r["workload"]
        assert w["batch"] * w["accum"] == 16
    first = recs[0]["next_micro_batch"]
    assert first is None or not first["fits_estimate"]     # the best already uses the largest that fits
    # a card too small for anything: no recommendation, no crash
    assert P.make_plan(p, (700 + 60) * 2**20, seq=512, verify=False)["recommendations"] == []


def test_plan_checks_each_recommendation_on_the_simulated_device(tmp_path):
    p = H.load_config(small_llama(tmp_path))
    # pure BF16 bases (what LoRA/QLoRA use); tests/test_estimate.py covers the other precisions
    plan = P.make_plan(p, (700 + 160) * 2**20, seq=512, global_batch=8, top=2, methods=("lora", "qlora"),
                       precisions=("bf16",))
    assert plan["recommendations"]
    for r in plan["recommendations"]:
        v = r["verified"]
        assert v["status"] == "fits", v
        assert v["reserved_bytes"] <= plan["usable_bytes"]
        assert abs(r["estimate_bytes"] / v["peak_bytes"] - 1) < 0.03
        n = r["next_micro_batch"]
        if n is not None:
            assert not n["fits_estimate"] and n["sim"]["status"] == "oom"


def test_plan_json_from_the_cli(capsys):
    assert main(["plan", "--config", str(SAMPLES["llama-3.1-8b"]), "--card", "24GiB", "--seq", "4096",
                 "--gpus", "2", "--no-verify", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d) >= {"model", "card_bytes", "usable_bytes", "gpus", "seq", "global_batch", "hardware",
                      "searched", "fitting", "recommendations", "notes"}
    assert d["card_bytes"] == 24 * 2**30 and d["gpus"] == 2
    r = d["recommendations"][0]
    assert set(r) >= {"rank", "method", "workload", "estimate_bytes", "need_bytes", "breakdown", "cost",
                      "techniques", "verified", "next_micro_batch", "command"}
    assert r["verified"]["status"] == "skipped"
    assert set(r["cost"]) == {"compute", "recompute", "offload", "dequant", "optimizer", "communication", "total"}
    assert r["techniques"]
    for t in r["techniques"]:
        assert t["saves_bytes"] == t["without_need_bytes"] - r["need_bytes"]
        assert isinstance(t["without_fits"], bool) and isinstance(t["costs_seconds"], float)


@pytest.mark.parametrize("argv, words", [
    (["plan", "--config", "X", "--json"], ["--card"]),
    (["plan", "--card", "24GiB", "--json"], ["--config"]),
    (["plan", "--model", "tiny", "--card", "24GiB", "--gpus", "3", "--global-batch", "16", "--json"], ["--global-batch"]),
    (["plan", "--model", "tiny", "--card", "lots", "--json"], ["不认识的显卡", "T4"]),
    (["plan", "--model", "tiny", "--card", "24GiB", "--seq", "100000", "--json"], ["--seq"]),
    (["plan", "--model", "tiny", "--card", "24GiB", "--record", "--json"], ["--record", "--bench"]),
])
def test_plan_bad_arguments(argv, words, capsys):
    assert main(argv) == 2
    out = capsys.readouterr()
    msg = json.loads(out.out)["message"]
    assert CJK.search(msg) and all(w in msg for w in words), msg


# --- QLoRA's NF4 base on the simulated device --------------------------------------------------------

def test_nf4_stand_in_stores_4_bits_and_matches_the_estimate(tmp_path):
    p = H.load_config(small_llama(tmp_path, "nf4", hidden_size=512, intermediate_size=1024))
    w = Workload(model=p.name, batch=2, seq=256, precision="bf16", lora_rank=8, qlora=True)
    q = P.run_on_sim(w, None)
    e = E.estimate(w, device="sim")
    # NF4 + double quantisation: 4.127 bits a weight; everything else fp32 (prepare_model_for_kbit_training)
    n = 1024 * 1024
    assert abs(E.nf4_bytes(n) / n - 4.127 / 8) < 1e-3
    assert abs(q["breakdown"]["parameters"] / e.breakdown["parameters"] - 1) < 0.02
    assert abs(e.total_bytes / q["peak_bytes"] - 1) < 0.02


# --- accuracy on every sample config (slow: 12 runs of 0.1-47 B-parameter models) --------------------

@pytest.mark.slow
@pytest.mark.parametrize("stem", sorted(KNOWN_PARAMS))
def test_estimate_within_3_percent_of_the_simulated_device(stem):
    p = H.load_config(SAMPLES[stem])
    for label, w in P.bench_workloads(p):
        sim = P.run_on_sim(w, None)
        assert abs(E.estimate(w, device="sim").total_bytes / sim["peak_bytes"] - 1) < 0.03, (stem, label)


def test_invalid_workload_for_config_preset():
    p = H.load_config(SAMPLES["bert-base-uncased"])
    with pytest.raises(WorkloadError, match="512"):
        E.estimate(Workload(model=p.name, seq=1024))


# --- cards, precisions, LoRA targets, 8-bit AdamW, back-off (issue 30) ------------------------------

def test_card_table_knows_bf16_and_its_sources():
    assert {"T4", "V100-16GB", "V100-32GB", "A10", "RTX3090", "RTX4090", "L4", "A100-40GB", "A100-80GB", "H100",
            "H200"} <= set(P.CARDS)
    for c in P.CARDS.values():
        assert c.source and CJK.search(c.source) and c.tflops16 > c.tflops32 > 0 and c.hbm_gbps > 0
        assert c.bf16 == (c.name not in ("T4", "V100-16GB", "V100-32GB")), c.name
    assert P.find_card("t4") is P.CARDS["T4"] and P.find_card("A100 80GB") is P.CARDS["A100-80GB"]
    assert P.find_card("rtx 4090") is P.CARDS["RTX4090"] and P.find_card("24GiB") is None


def test_cards_without_bf16_get_fp16_with_loss_scaling():
    p = H.load_config(SAMPLES["llama-3.1-8b"])
    plan = P.make_plan(p, P.CARDS["T4"], verify=False)
    assert plan["bf16"] is False and plan["card_bytes"] == 16 * 2**30
    assert plan["recommendations"]
    for r in plan["recommendations"]:
        assert not r["workload"]["precision"].startswith("bf16"), r["summary"]
        if r["workload"]["precision"] == "fp16-mixed":
            assert any("GradScaler" in x for x in r["warnings"])
    assert any("没有 BF16" in n for n in plan["notes"])
    # full fine-tuning never offers pure FP16 weights
    cands = P.candidates(p, 2048, 16, 1, bf16=False)
    assert not any(c.workload.precision == "fp16" and not c.workload.lora_rank for c in cands)


def test_step_time_scales_with_the_card():
    p = H.load_config(SAMPLES["llama-3.1-8b"])
    c = P.Candidate(Workload(model=p.name, batch=1, seq=2048, precision="bf16-mixed", lora_rank=16))
    t4, h100 = (P.step_cost(c, p, P.CARDS[n].hardware()) for n in ("T4", "H100"))
    assert t4["compute"] / h100["compute"] == pytest.approx(989.4 / 65.0)
    plan = P.make_plan(p, P.CARDS["H100"], verify=False, top=1)
    assert plan["hardware"]["bf16_tflops"] == 989.4 and plan["hardware"]["pcie_gbps"] == 63.0


def test_lora_targets_are_stated_and_chosen():
    p = H.load_config(SAMPLES["llama-3.1-8b"])
    default = P.make_plan(p, 24 * 2**30, seq=4096, verify=False, methods=("lora",), top=1)["recommendations"][0]
    assert "q_proj、v_proj（peft 默认）" in default["summary"] and default["lora_targets"]
    every = P.make_plan(p, 24 * 2**30, seq=4096, verify=False, methods=("lora",), top=1,
                        lora_targets="all-linear")["recommendations"][0]
    assert "全部线性层" in every["summary"] and "--lora-targets all-linear" in every["command"]
    assert every["trainable_params"] == E.lora_params(p, 16, "all-linear") > 5 * E.lora_params(p, 16)
    with pytest.raises(WorkloadError):
        P.make_plan(p, 24 * 2**30, verify=False, lora_targets="everything")


def test_moe_qlora_is_named_as_skipped():
    p = H.load_config(SAMPLES["mixtral-8x7b-v0.1"])
    plan = P.make_plan(p, 80 * 2**30, verify=False, methods=("qlora",))
    assert not plan["recommendations"]
    assert [s["summary"] for s in plan["skipped"]] == ["QLoRA（MoE 模型）"]
    assert "nn.Linear" in plan["skipped"][0]["reason"]


def test_8bit_adamw_only_where_it_saves_a_meaningful_share():
    p = H.load_config(SAMPLES["llama-3.1-8b"])
    plan = P.make_plan(p, 24 * 2**30, seq=4096, verify=False, top=5)
    for r in plan["recommendations"]:
        assert not (r["workload"]["optimizer"] == "adamw8bit" and r["workload"]["lora_rank"]), r["summary"]
    assert any("8-bit AdamW" in s["summary"] and "不到 5%" in s["reason"] for s in plan["skipped"])
    # full fine-tuning of a 1.5B model on 16 GiB: m and v are a large share, 8-bit AdamW stays
    q = H.load_config_dict(dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_hidden_layers=28,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True,
        hidden_act="silu"), "qwen-1.5b")
    _, ranked, _ = P.search(q, 16 * 2**30, methods=("full",))
    eight = [r[0] for r in ranked if r[0].workload.optimizer == "adamw8bit"]
    assert eight, "8-bit AdamW is kept where it saves more than 5% of the peak"
    for s in eight:
        base = E.estimate(replace(s.workload, optimizer="adamw")).total_bytes
        assert base - s.estimate.total_bytes >= P.EIGHT_BIT_MIN_SHARE * base


def test_plan_backs_off_the_micro_batch_then_the_recipe(tmp_path, monkeypatch):
    """The simulated device says no to every micro-batch above 1 and to all full fine-tuning: the plan
    takes micro-batch 1 of the LoRA recipes, gives up the full fine-tuning ones, and names both."""
    p = H.load_config(small_llama(tmp_path))
    calls = []

    def fake_sim(w, budget, steps=1, qlora=False):
        calls.append((w.optimizer, w.batch))
        if w.batch > 1 or not w.lora_rank:
            return {"status": "oom", "message": "CUDA out of memory（模拟）", "seconds": 0.0}
        return {"status": "fits", "peak_bytes": 1, "reserved_bytes": 1, "breakdown": {}, "seconds": 0.0}

    monkeypatch.setattr(P, "run_on_sim", fake_sim)
    plan = P.make_plan(p, (700 + 400) * 2**20, seq=512, global_batch=8, top=3)
    recs = plan["recommendations"]
    assert recs and all(r["workload"]["batch"] == 1 and r["verified"]["status"] == "fits" for r in recs)
    assert all(r["workload"]["lora_rank"] for r in recs)
    oom = [s for s in plan["skipped"] if "模拟设备上 OOM" in s["reason"]]
    assert oom and any("改试更小的微批次" in s["reason"] for s in oom)
    assert any("没有更小的微批次" in s["reason"] for s in oom)
    for r in recs:
        n = r["next_micro_batch"]
        assert n is None or n["sim"]["status"] == "oom"


def test_plan_takes_the_next_micro_batch_when_it_fits_on_the_simulated_device(tmp_path, monkeypatch):
    p = H.load_config(small_llama(tmp_path))

    def roomy_sim(w, budget, steps=1, qlora=False):
        if w.batch > 4:
            return {"status": "oom", "message": "CUDA out of memory（模拟）", "seconds": 0.0}
        return {"status": "fits", "peak_bytes": 1, "reserved_bytes": 1, "breakdown": {}, "seconds": 0.0}

    monkeypatch.setattr(P, "run_on_sim", roomy_sim)
    plan = P.make_plan(p, (700 + 100) * 2**20, seq=512, global_batch=16, top=1, methods=("lora",))
    r = plan["recommendations"][0]
    assert r["workload"]["batch"] == 4 and r["next_micro_batch"]["sim"]["status"] == "oom"


@pytest.mark.slow
@pytest.mark.parametrize("stem, gib", [("llama-3.1-8b", 16), ("qwen2.5-7b", 24), ("gpt2-medium", 16),
                                       ("bert-base-uncased", 24), ("mistral-7b-v0.1", 48), ("llama-3.1-8b", 80)])
def test_picks_fit_and_the_next_micro_batch_does_not(stem, gib):
    """The planner's claims checked on the simulated device (a deterministic sample; the whole
    sweep, every sample config x 16/24/48/80 GiB, is `vramlab plan --bench --sweep`)."""
    plan = P.make_plan(H.load_config(SAMPLES[stem]), gib * 2**30, top=2)
    rows = P.check_plan(plan)
    assert rows, (stem, gib)
    for row in rows:
        assert row["ok"], (stem, gib, row)
        assert row["pick_status"] != "fits" or row["pick_fits"]


def test_bench_and_sweep_record_their_figures(tmp_path, monkeypatch):
    """`vramlab plan --bench [--sweep] --record` appends one entry to the performance history:
    the bench's ratio range, the sweep's pick counts and one mark per pick and card per config."""
    from vramlab import perf

    rows = [{"config": "a", "card_gib": 16, "summary": "s", "pick_status": "fits", "pick_fits": True, "next_batch": 8,
             "next_fits_estimate": False, "next_sim": "oom", "ok": True},
            {"config": "a", "card_gib": 24, "summary": "s", "pick_status": "skipped", "pick_fits": False,
             "next_batch": None, "next_fits_estimate": None, "next_sim": None, "ok": True},
            {"config": "b", "card_gib": 16, "summary": "（没有装得下的组合）", "pick_status": "-", "pick_fits": None,
             "next_batch": None, "next_fits_estimate": None, "next_sim": None, "ok": True}]
    fig = P.sweep_figures(rows, cards=(16, 24))
    assert fig["推荐方案"] == 2 and fig["模拟设备上装得下"] == 1 and fig["未在模拟设备上验证"] == 1
    assert fig["下一档（估算装不下）核对"] == 1 and fig["其中模拟其实装得下"] == 0 and fig["全部通过"] is True
    assert fig["a"] == "16:✓ 24:·" and fig["b"] == "16:— 24:"
    assert P.bench_figures([{"config": "x", "ratio": 0.99}, {"config": "y", "ratio": 1.01}]) == {
        "估算/模拟设备 最小": 0.99, "最大": 1.01, "示例 config": 2}
    history = tmp_path / "history.jsonl"
    entry = perf.record("plan-sweep", "vramlab plan --bench --sweep --record", fig, path=history, commit="0784056")
    assert perf.history(history) == [entry] and entry["commit"] == "0784056"

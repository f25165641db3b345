"""The `vramlab` command line end to end, in a subprocess as a user runs it."""
import json
import subprocess
import sys

import pytest

from vramlab.units import MiB

pytestmark = pytest.mark.slow       # starts processes: the full tier (make test), not make check


def run(*args):
    return subprocess.run([sys.executable, "-m", "vramlab.cli", *args], capture_output=True, text=True, timeout=300)


def test_estimate_json_has_total_and_breakdown():
    r = run("estimate", "--model", "gpt2-small", "--batch", "8", "--seq", "512", "--optimizer", "adamw",
            "--precision", "fp32", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["total_bytes"] == sum(out["breakdown"].values())
    assert 0.9 < out["total_bytes"] / MiB / 7925 < 1.1          # H200 reference row


def test_estimate_human_output_is_chinese_table():
    r = run("estimate", "--model", "gpt2-small", "--zero", "3", "--gpus", "8", "--precision", "bf16-mixed")
    assert r.returncode == 0, r.stderr
    assert "优化器状态" in r.stdout and "合计" in r.stdout


def test_measure_sim_json_and_fake_agree():
    args = ["measure", "--model", "tiny", "--batch", "2", "--seq", "64", "--backend", "sim", "--json"]
    real = json.loads(run(*args).stdout)
    fake = json.loads(run(*args, "--fake").stdout)
    assert real["peak_bytes"] > 0 and set(real["breakdown"]) >= {"parameters", "activations", "optimizer_state"}
    assert abs(real["peak_bytes"] - fake["peak_bytes"]) <= 0.01 * real["peak_bytes"]
    assert fake["fake"] is True and real["backend"] == "sim"


def test_measure_human_output():
    r = run("measure", "--model", "gpt2-small", "--fake", "--batch", "8", "--seq", "512")
    assert r.returncode == 0, r.stderr
    assert "稳态峰值" in r.stdout and "激活值" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["estimate", "--optimizer", "lion"], "--optimizer"),
    (["estimate", "--batch", "zero"], "--batch"),
    (["estimate", "--batch", "0"], "正整数"),
    (["estimate", "--model", "gpt5"], "未知模型预设"),
    (["estimate", "--seq", "4096"], "最多支持"),
    (["estimate", "--zero", "3"], "--gpus"),
    (["measure", "--model", "llama-7b"], "--fake"),
    (["measure", "--model", "tiny", "--zero", "2", "--gpus", "2"], "estimate"),
    (["measure", "--backend", "cuda", "--model", "tiny"], None),
    (["frobnicate"], "子命令"),
    (["estimate", "--inference", "--optimizer", "sgd"], "--inference"),      # issue 19: refused, not ignored
    (["calibrate", "--rows", "nosuchrow"], "nosuchrow"),
    (["tutorials", "check", "--only", "ch99"], "ch99"),
    (["trace", "--model", "tiny", "--out", "/"], "文件夹"),
    (["grade", "ch01-estimate", "/no/such/file.ipynb"], "找不到提交的文件"),
])
def test_bad_input_gets_chinese_error_without_traceback(args, needle):
    r = run(*args)
    if args[:2] == ["measure", "--backend"] and r.returncode == 0:
        pytest.skip("this machine has a GPU")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and "usage:" not in r.stderr and "error:" not in r.stderr
    assert "错误" in r.stderr
    if needle:
        assert needle in r.stderr


def test_calibrate_json_on_selected_rows():
    r = run("calibrate", "--json", "--backends", "sim", "--rows", "small_fp32_adamw_b8_s512,small_fp32_lora_b8_s512")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert [row["name"] for row in rep["rows"]] == ["small_fp32_adamw_b8_s512", "small_fp32_lora_b8_s512"]
    assert all(abs(row["sim_over_h200"] - 1) < 0.03 for row in rep["rows"])

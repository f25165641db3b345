"""The GPU evidence script (vramlab/evidence.py): its dry run on the simulated device, the committed
evidence the site shows, and the cards' "not measured on a GPU yet" when there is none."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from vramlab import evidence
from vramlab.exercises import EXERCISES

REPO = Path(__file__).resolve().parents[1]


def _hook():
    spec = importlib.util.spec_from_file_location("exercises_hook", REPO / "docs" / "hooks" / "exercises.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_sim_evidence_is_current_and_as_expected():
    """Every exercise's reference passed and its starter failed on the simulated device, graded from
    the spec as it is now: a spec changed since (its code, target or workload) makes this fail,
    until `vramlab evidence` is run again (see vramlab/data/evidence/README.md)."""
    sim = evidence.committed().get("sim")
    assert sim is not None, "vramlab/data/evidence/ 里没有模拟设备的证据"
    rows = {(r["exercise"], r["code"]): r for r in sim["gradings"]}
    stale = []
    for spec in EXERCISES.values():
        for code in ("solution", "starter"):
            row = rows.get((spec.id, code))
            assert row is not None, f"{spec.id} {code} 不在证据里"
            if row["spec_sha256"] != evidence.spec_fingerprint(spec, sim["scale"]):
                stale.append(f"{spec.id} {code}")
                continue
            assert "error" not in row, row
            assert row["passed"] == (code == "solution"), row
            assert row["target_ratio"] == spec.target_ratio
    assert not stale, f"证据过期了（重新运行 vramlab evidence，见 vramlab/data/evidence/README.md）：{stale}"
    m = sim["machine"]
    assert m["torch"] and m["date"] and m["commit"], m


def test_card_says_not_measured_on_a_gpu_without_gpu_evidence():
    hook = _hook()
    reports = {k: v for k, v in evidence.committed().items() if k != "cuda"}
    figures = evidence.exercise_figures("ch07-checkpoint", reports)
    assert figures["cuda"] is None and figures["sim"]["solution"]["passed"]
    lines = hook._evidence_lines("ch07-checkpoint")
    gpu_line = next(line for line in lines if line.startswith("| GPU"))
    if "cuda" not in evidence.committed():
        assert "尚未在 GPU 上测量" in gpu_line
    sim_line = next(line for line in lines if line.startswith("| 模拟设备"))
    assert "通过" in sim_line and "torch" in sim_line and "vramlab/data/evidence/" in sim_line


def test_card_shows_gpu_figures_side_by_side_when_there_are_some(monkeypatch):
    sim = evidence.committed()["sim"]
    gpu = json.loads(json.dumps(sim))
    gpu.update(backend="cuda", scale="gpu", file="h200.json")
    gpu["machine"].update(gpu="NVIDIA H200", torch="2.13.0+cu130")
    for r in gpu["gradings"]:
        r["ratio"] = 0.5 if r["code"] == "solution" else 1.0
    monkeypatch.setattr(evidence, "committed", lambda: {"sim": sim, "cuda": gpu})
    lines = _hook()._evidence_lines("ch07-checkpoint")
    gpu_line = next(line for line in lines if line.startswith("| GPU"))
    assert "0.500，通过" in gpu_line and "NVIDIA H200" in gpu_line and "gpu 规模" in gpu_line


def test_cuda_backend_without_a_gpu_is_refused_before_any_work(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert evidence.main([str(tmp_path / "out"), "--backend", "cuda"]) == 2
    assert "NVIDIA GPU" in capsys.readouterr().err
    assert not (tmp_path / "out" / "evidence.json").exists()


def test_bad_arguments_get_chinese_errors(tmp_path, capsys):
    for args in (["--only", "ch99-nothing"], ["--calibrate-rows", "nosuchrow"], ["--jobs", "0"]):
        with pytest.raises(SystemExit) as e:
            evidence.main([str(tmp_path / "out"), *args])
        assert e.value.code == 2
        assert "错误" in capsys.readouterr().err


@pytest.mark.slow
def test_dry_run_on_the_simulated_device(tmp_path):
    """The GPU script's plumbing, at CI scale on the simulated device: a single-process and a
    2-rank exercise, one calibration row, one tutorial-free run."""
    out = tmp_path / "evidence"
    rc = evidence.main([str(out), "--backend", "sim", "--scale", "ci", "--only", "ch01-estimate,ch08-allreduce",
                        "--calibrate-rows", "small_fp32_adamw_b8_s128", "--jobs", "2"])
    report = json.loads((out / "evidence.json").read_text(encoding="utf-8"))
    assert rc == 0, report["gradings"]
    assert [(r["exercise"], r["code"]) for r in report["gradings"]] == [
        ("ch01-estimate", "solution"), ("ch01-estimate", "starter"),
        ("ch08-allreduce", "solution"), ("ch08-allreduce", "starter")]
    assert all(r["agrees"] for r in report["gradings"])
    [row] = report["calibration"]["rows"]
    assert row["name"] == "small_fp32_adamw_b8_s128" and abs(row["sim_over_h200"] - 1) < 0.05
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert "ch08-allreduce" in summary and "4 次评分，4 次与预期一致" in summary

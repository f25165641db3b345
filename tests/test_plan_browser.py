"""The fine-tune planner page (docs/tools/plan.md) in headless Chromium: the JavaScript port of
`vramlab plan` must give the same plan as the command line (without the simulated-device check,
which the browser cannot run), and refuse unsupported configs with the same Chinese message.
"""
from __future__ import annotations

import json

import pytest

from test_site_browser import browser, offline_root, site_url, watch  # noqa: F401  (fixtures)
from vramlab import hfconfig as H
from vramlab import plan as P

pytestmark = pytest.mark.slow       # starts processes: the full tier (make test), not make check

GiB = 2**30
# (sample config, form fields, make_plan keyword arguments)
CASES = [
    ("llama-3.1-8b", dict(card="24GiB", seq="4096"), dict(card=24 * GiB, seq=4096)),
    ("qwen2.5-7b", dict(card="48GiB", gpus="2", global_batch="32"), dict(card=48 * GiB, gpus=2, global_batch=32)),
    ("mixtral-8x7b-v0.1", dict(card="80GiB", gpus="8", seq="1024"), dict(card=80 * GiB, gpus=8, seq=1024)),
    ("gpt2-medium", dict(card="8GiB", method="full"), dict(card=8 * GiB, methods=("full",))),
    ("bert-base-uncased", dict(card="6GiB", lora_rank="8"), dict(card=6 * GiB, lora_rank=8)),
    # a card by name: no BF16 on a T4 (FP16 with loss scaling), its own speed; LoRA on every linear layer
    ("llama-3.1-8b", dict(card="T4", lora_targets="all-linear"), dict(card=P.CARDS["T4"], lora_targets="all-linear")),
    ("mistral-7b-v0.1", dict(card="a100 80gb", lora_targets="qkvo"), dict(card=P.CARDS["A100-80GB"], lora_targets="qkvo")),
]


def run(page, sample: str, fields: dict) -> dict:
    root = ".vramlab-plan"
    page.select_option(f"{root} select[name=sample]", sample)
    for name in ("card", "gpus", "seq", "global_batch", "lora_rank"):
        page.fill(f"{root} input[name={name}]", fields.get(name, {"card": "24GiB", "gpus": "1", "global_batch": "16",
                                                                  "lora_rank": "16"}.get(name, "")))
    page.select_option(f"{root} select[name=method]", fields.get("method", "any"))
    page.select_option(f"{root} select[name=lora_targets]", fields.get("lora_targets", "default"))
    page.click(f"{root} button[name=go]")
    out = page.locator(f"{root} .vramlab-plan__out")
    page.wait_for_function("document.querySelector('.vramlab-plan__out').hasAttribute('data-plan') || "
                           "document.querySelector('.vramlab-plan__out').hasAttribute('data-error')")
    if out.get_attribute("data-error") is not None:
        return {"error": out.get_attribute("data-error")}
    return json.loads(out.get_attribute("data-plan"))


def test_planner_equals_the_command_line(watch, site_url):  # noqa: F811
    page = watch.page
    page.goto(site_url + "tools/plan/", wait_until="load")
    page.wait_for_selector(".vramlab-plan form")
    for sample, fields, kwargs in CASES:
        got = run(page, sample, fields)
        assert "error" not in got, got
        want = P.make_plan(H.load_config(H.CONFIG_DIR / f"{sample}.json"), verify=False, **kwargs)
        for k in ("searched", "fitting", "seq", "usable_bytes", "gpus", "global_batch", "bf16", "card", "hardware"):
            assert got[k] == want[k], (sample, k)
        assert [(s["summary"], s["reason"]) for s in got["skipped"]] == \
               [(s["summary"], s["reason"]) for s in want["skipped"]], sample
        assert len(got["recommendations"]) == len(want["recommendations"]) > 0, sample
        for g, w in zip(got["recommendations"], want["recommendations"]):
            for k in ("summary", "method", "workload", "estimate_bytes", "need_bytes", "breakdown", "next_micro_batch",
                      "lora_targets"):
                assert g[k] == w[k], (sample, w["rank"], k)
            for k, v in w["cost"].items():
                assert abs(g["cost"][k] - v) < 1e-6, (sample, k)
            assert [(t["technique"], t["without_need_bytes"], t["without_fits"]) for t in g["techniques"]] == \
                   [(t["technique"], t["without_need_bytes"], t["without_fits"]) for t in w["techniques"]]
    assert page.locator(".vramlab-plan__rec").count() >= 1
    watch.assert_clean()


def test_planner_refuses_unsupported_configs_like_python(watch, site_url, tmp_path):  # noqa: F811
    page = watch.page
    page.goto(site_url + "tools/plan/", wait_until="load")
    page.wait_for_selector(".vramlab-plan form")
    for cfg in ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]},
                {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2}):
        page.select_option(".vramlab-plan select[name=sample]", "")
        page.fill(".vramlab-plan textarea[name=config]", json.dumps(cfg))
        page.click(".vramlab-plan button[name=go]")
        page.wait_for_function("document.querySelector('.vramlab-plan__out').hasAttribute('data-error')")
        err = page.locator(".vramlab-plan__out").get_attribute("data-error")
        with pytest.raises(H.ConfigError) as py_err:
            H.preset_from_config(cfg, where="pasted")
        assert err == str(py_err.value)
    watch.assert_clean()


def test_planner_works_from_file_urls(watch, offline_root):  # noqa: F811
    page = watch.page
    page.goto((offline_root / "tools" / "plan.html").as_uri(), wait_until="load")
    page.wait_for_selector(".vramlab-plan form")
    got = run(page, "gpt2-medium", dict(card="8GiB"))
    assert got["recommendations"] and got["model"]["params"] == 354_823_168
    watch.assert_clean()

"""Data for the website's VRAM calculator, generated from the Python code it must agree with.

    python -m vramlab.webdata            # rewrites docs/assets/calculator/presets.js
    python -m vramlab.webdata --check    # exit 1 if the committed file is out of date

The calculator (docs/assets/calculator/calculator.js) ports the formulas of `vramlab.estimate`;
everything else it needs (model shapes, the allowed choices, constants, Chinese names) comes from
here, so a new preset or a changed constant reaches the page by re-running this module.
The file is a script that sets `window.VRAMLAB_CALC` (not JSON fetched at run time) because
browsers refuse `fetch()` from file://, and the offline build must work from there.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from . import estimate as E
from . import vocab
from .models import PRESETS
from .workload import ATTENTION, CHECKPOINTING, LORA_TARGETS, OFFLOAD, OPTIMIZERS, PRECISIONS

OUT = Path(__file__).resolve().parents[1] / "docs" / "assets" / "calculator" / "presets.js"

# Cards to check the estimate against: vendors' nominal capacities, in decimal GB (1 GB = 10^9 bytes),
# the convention of chapter 10 ("141 GB ≈ 131.3 GiB"). RTX 4090 24 GB, A100 40 GB, A100/H100 80 GB,
# H200 141 GB (data sheets cited in chapter 1).
CARDS_GB = (24, 40, 80, 141)
# What the allocator can't use: the CUDA context, about 600-700 MiB outside the caching allocator
# (vramlab/data/h200_gpt2_peaks.md, PyTorch 2.11 on an H200). An estimate closer than this to the
# card's size is marked "tight".
CONTEXT_RESERVE_BYTES = 700 * E.MiB

CATEGORY_ZH = vocab.labels(E.KEYS)      # the estimator's breakdown


def _preset(p) -> dict:
    c = p.config
    return {"family": p.family, "note": p.note, "fake_only": p.fake_only, "n_layers": p.n_layers,
            "hidden": p.hidden, "heads": p.heads, "kv_heads": p.kv_heads, "vocab": p.vocab,
            "ffn_hidden": p.ffn_hidden, "head_dim": c.get("head_dim") or p.hidden // p.heads,
            "positions": c.get("n_positions", c.get("max_position_embeddings", 0)),
            "tie_word_embeddings": bool(c.get("tie_word_embeddings")),
            "num_local_experts": c.get("num_local_experts", 0),
            "num_experts_per_tok": c.get("num_experts_per_tok", 1),
            "params": E.param_count(p)}     # the JS recomputes this; the page shows both agree


def fit_verdict(total_bytes: int, card_gb: int) -> str:
    """'fits', 'tight' (fits only without the CUDA context's share) or 'no'. Same rule as the JS."""
    cap = card_gb * 10**9
    if total_bytes + CONTEXT_RESERVE_BYTES <= cap:
        return "fits"
    return "tight" if total_bytes <= cap else "no"


def calculator_data() -> dict:
    return {
        # cfg:* are config.json files registered at run time (vramlab.hfconfig), not presets
        "presets": {name: _preset(p) for name, p in PRESETS.items() if not name.startswith("cfg:")},
        "choices": {"optimizer": list(OPTIMIZERS), "precision": list(PRECISIONS),
                    "checkpointing": list(CHECKPOINTING), "attention": list(ATTENTION), "offload": list(OFFLOAD),
                    "lora_targets": list(LORA_TARGETS)},
        "keys": list(E.KEYS), "phases": list(E.PHASES), "category_zh": CATEGORY_ZH,
        "phase_zh": dict(E._PHASE_ZH),
        "dtype_bytes": dict(E.DTYPE_BYTES), "cublas_workspace_bytes": E.CUBLAS_WORKSPACE_BYTES,
        "lora_targets": {k: list(v) for k, v in E.LORA_TARGETS.items()},
        "bnb_blocksize": E.BNB_BLOCKSIZE, "bnb_min_8bit_size": E.BNB_MIN_8BIT_SIZE,
        "cards_gb": list(CARDS_GB), "context_reserve_bytes": CONTEXT_RESERVE_BYTES,
        "plan": plan_data(),
    }


def plan_data() -> dict:
    """What docs/assets/calculator/plan.js needs to run `vramlab plan`'s search in the browser."""
    from dataclasses import asdict

    from . import hfconfig as H
    from . import plan as P

    samples = {}
    for path in H.sample_configs():
        samples[path.stem] = json.loads(path.read_text(encoding="utf-8"))
    return {
        "hardware": asdict(P.Hardware()), "context_bytes": P.CONTEXT_BYTES,
        "allocator_overhead": P.allocator_overhead(), "pareto_step": P.PARETO_STEP, "nf4_bytes": P.NF4_BYTES,
        "precisions": list(P.PRECISIONS), "precisions_no_bf16": list(P.PRECISIONS_NO_BF16), "methods": list(P.METHODS),
        "eight_bit_min_share": P.EIGHT_BIT_MIN_SHARE, "moe_qlora_reason": P.MOE_QLORA_REASON, "targets_zh": P.TARGETS_ZH,
        "default_target_names": P.DEFAULT_TARGET_NAMES,
        "cards": {k: asdict(c) for k, c in P.CARDS.items()}, "card_aliases": P._CARD_ALIASES,
        "pcie": {str(k): v for k, v in P._PCIE.items()},
        "method_zh": P.METHOD_ZH, "precision_zh": P.PRECISION_ZH, "optimizer_zh": P.OPTIMIZER_ZH,
        "ckpt_zh": P.CKPT_ZH, "families": H.FAMILIES, "architectures": H._ARCH, "required": H.REQUIRED,
        "family_zh": H.FAMILY_ZH, "supported_zh": H.SUPPORTED_ZH, "max_pos_default": H._MAX_POS_DEFAULT,
        "samples": samples,
    }


def render() -> str:
    body = json.dumps(calculator_data(), ensure_ascii=False, indent=1, sort_keys=False)
    return ("// 由 `python -m vramlab.webdata` 从 vramlab 的 Python 代码生成，请勿手改。\n"
            f"window.VRAMLAB_CALC = {body};\n")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in argv:
        if not OUT.is_file() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} 已过期：请运行 python -m vramlab.webdata", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"已写入 {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

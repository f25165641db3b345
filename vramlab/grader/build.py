"""The trusted builders of a grading scenario: the device, the model, the optimizer and the data.

A grading child (harness.py) builds a scenario with these rules before any learner code runs;
`vramlab.exercise_setup(id)` builds the same objects in the learner's own process, so what a learner
traces is what was graded. The rules, in one place:

* the model: the job's preset (vramlab.models) with SDPA attention, no dropout, the job's config
  overrides, seeded with the job's seed, created on the device, in train mode;
* the optimizer: AdamW over all its parameters, the job's learning rate, `foreach=True`;
* the data: token ids drawn from a generator seeded with seed + 1, over the config's vocabulary.
"""
from __future__ import annotations

import contextlib

FAMILIES = {"gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM", "llama": "LlamaForCausalLM",
            "mixtral": "MixtralForCausalLM"}


def build_model(job: dict, dev, config: dict, seed: int):
    """A seeded model of the job's preset with `config` overrides, on the device, in train mode."""
    from ..models import build_model as build

    return build(job.model, attention="sdpa", dropout=0.0, seed=seed, device=dev.torch_device, **config).train()


def optimizer_for(job: dict, params):
    import torch

    return torch.optim.AdamW(params, lr=float(job.lr), foreach=True)


def static_bytes(params, settings) -> int:
    """The physical floor of a training step: parameters, gradients and 2 AdamW states on the device;
    fewer copies where states may live in host memory (allow_host) or gradients are freed early
    (floor_copies)."""
    copies = float(getattr(settings, "floor_copies", None) or (2 if getattr(settings, "allow_host", False) else 4))
    return int(sum(p.numel() * p.element_size() for p in params) * copies)


def tokens(job: dict, dev, shape, on_host: bool = False):
    """Seeded token ids: on the device, or in host memory (not device memory)."""
    import torch

    from ..models import get_preset

    gen = torch.Generator().manual_seed(job.seed + 1)
    vocab = int(job.config.get("vocab_size") or get_preset(job.model).vocab)
    with (dev.host() if on_host else contextlib.nullcontext()):
        t = torch.randint(0, vocab, tuple(shape), generator=gen)
    return t if on_host else t.to(dev.torch_device)


def attach(h) -> None:
    """Give a scenario's `h` the builders it calls (`h.build_model`, `h.training_setup`, `h.tokens`);
    `h` has `job`, `dev`, `settings` and `payload`."""
    def training_setup():
        """The job's model (seeded) and AdamW, on the device; remembered for the guards."""
        model = build_model(h.job, h.dev, h.job.config, h.job.seed)
        params = list(model.parameters())
        h.model = model
        h.payload["param_count"] = sum(p.numel() for p in params)
        h.payload["static_bytes"] = static_bytes(params, h.settings)
        return model, optimizer_for(h.job, params)

    h.build_model = lambda config, seed: build_model(h.job, h.dev, config, seed)
    h.training_setup = training_setup
    h.tokens = lambda shape, on_host=False: tokens(h.job, h.dev, shape, on_host)

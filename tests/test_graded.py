"""What a learner needs to investigate a graded case: `vramlab.exercise_setup(id)` rebuilds it as
the grader did, `build_model` takes config overrides quietly, SimDevice answers to torch.cuda's
names, and a checkpoint's recomputation counts as activations."""
from __future__ import annotations

import logging
import math

import pytest
import torch

import recorded_runs
import vramlab
from vramlab.exercises import get_exercise
from vramlab.models import PRESETS, build_model


def _run_starter(s, exercise_id):
    """The starter through all the graded steps, the peak measured after the warm-up like the grader."""
    ns: dict = {}
    exec(get_exercise(exercise_id).starter, ns)
    losses = []
    with s.device:
        for i, batch in enumerate(s.batches):
            if i == s.warmup:
                s.device.reset_peak_memory_stats()
            losses.append(ns[s.function](s.model, s.optimizer, batch, s.device))
    return losses, s.device.max_memory_allocated()


@pytest.mark.parametrize("exercise_id", ["ch05-accumulation", "ch07-checkpoint", "ch21-leak"])
def test_exercise_setup_is_what_the_grader_ran(exercise_id):
    """The starter on exercise_setup's objects gives the trusted run's losses and, to the byte, its
    peak (the trusted run recorded by scripts/record_alternatives.py: no card, like the grader's)."""
    from vramlab.grader.core import make_job

    spec = get_exercise(exercise_id)
    doc = recorded_runs.load(exercise_id)
    runs = (doc or {}).get("runs", {}).get(recorded_runs.run_key(make_job(spec, "ci", "sim", 1).with_(reference=True),
                                                                 spec.starter))
    if not runs:
        pytest.skip(f"no recorded starter run of {exercise_id} for this job (scripts/record_alternatives.py)")
    truth = runs[0]["payload"]
    s = vramlab.exercise_setup(exercise_id)
    assert s.args == (s.model, s.optimizer, s.batch, s.device) and s.batch is s.batches[0]
    assert len(s.batches) == s.steps == len(truth["losses"])
    s.device.set_budget(None)              # the trusted run has no card; the learner's (ch21) has one
    losses, peak = _run_starter(s, exercise_id)
    assert peak == truth["peak_bytes"]
    assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(losses, truth["losses"])), (losses, truth["losses"])


def test_exercise_setup_keeps_the_learners_card_and_arguments():
    s = vramlab.exercise_setup("ch21-leak")
    assert s.device.budget == int(get_exercise("ch21-leak").ci.settings.learner_budget_mib * 2 ** 20)
    assert s.config["vocab_size"] == 8192 and s.model.config.vocab_size == 8192
    epoch = vramlab.exercise_setup("ch04-dataloading")
    assert epoch.arg_names == ["model", "optimizer", "tokens", "device", "batch_size"]
    assert epoch.tokens.untyped_storage()._cdata not in epoch.device.tracker.live     # the dataset is in host memory
    with pytest.raises(ValueError, match="exercise_setup"):
        vramlab.exercise_setup("ch14-attention")


def test_build_model_takes_config_overrides():
    m = build_model("tiny", n_layer=6, vocab_size=512)
    assert len(m.transformer.h) == 6 and m.config.vocab_size == 512
    with pytest.raises(TypeError, match="n_layers"):
        build_model("tiny", n_layers=6)


def test_build_model_prints_no_library_warning(caplog, capsys):
    """transformers warns about GPT-2's loss name on every new model's first forward, in English."""
    with caplog.at_level(logging.WARNING):
        for name, preset in PRESETS.items():
            if preset.fake_only:
                continue
            layers = {"n_layer": 1} if preset.family == "gpt2" else {"num_hidden_layers": 1}
            model = build_model(name, **layers)
            ids = torch.zeros(1, 8, dtype=torch.long)
            model(input_ids=ids, labels=ids).loss.backward()
    out = capsys.readouterr()
    assert not caplog.records and not out.err, (caplog.records, out.err)


def test_sim_device_answers_to_torch_cuda_names():
    with vramlab.SimDevice() as dev:
        x = torch.randn(1024, 1024)
        y = x * 2
        del y
        assert dev.memory_allocated() == dev.allocated() == 4 * 2 ** 20
        assert dev.max_memory_allocated() == dev.max_allocated() == 8 * 2 ** 20
        assert dev.memory_reserved() == dev.reserved() and dev.max_memory_reserved() == dev.max_reserved()
        dev.reset_peak_memory_stats()
        assert dev.max_memory_allocated() == 4 * 2 ** 20
        del x


def test_a_learner_resetting_the_peak_by_torchs_name_is_caught():
    from vramlab.grader import guards

    assert guards.DEVICE_RULES["reset_peak_memory_stats"] == "reset_peak"


def test_recomputed_activations_are_activations():
    """Under checkpointing, what each block's forward makes again during backward is filed as
    activations, named after the module (not the backward's temporaries)."""
    from torch.utils.checkpoint import checkpoint

    with vramlab.SimDevice() as dev:
        model = build_model("tiny", device=dev.torch_device)
        ids = torch.randint(0, 1024, (4, 128))
        ids = dev.to_device(ids)
        x = model.transformer.wte(ids) + model.transformer.wpe(torch.arange(128))
        for block in model.transformer.h:
            x = checkpoint(block, x, use_reentrant=False)
        x = x[0] if isinstance(x, tuple) else x
        kinds = {}
        real_release = dev.tracker._release

        def release(key):
            rec = dev.tracker.live.get(key)
            if rec is not None and rec.where.startswith("recompute:"):
                kinds[rec.category] = kinds.get(rec.category, 0) + rec.charged
            real_release(key)
        dev.tracker._release = release
        model.lm_head(model.transformer.ln_f(x)).float().logsumexp(-1).mean().backward()
    assert kinds.get("activations", 0) > 2 ** 20 and set(kinds) == {"activations"}, kinds


def test_the_exercise_list_points_learners_at_notebooks_not_answers(capsys):
    from vramlab.cli import main

    assert main(["exercises"]) == 0
    out = capsys.readouterr().out
    assert "exercises/ch07-checkpoint/ch07-checkpoint.ipynb" in out
    assert "solutions/" not in out and "vramlab/exercises/" not in out and "参考答案" not in out
    assert main(["exercises", "--instructor"]) == 0
    out = capsys.readouterr().out
    assert "solutions/ch07-checkpoint/ch07-checkpoint.ipynb" in out and "vramlab/exercises/ch07_checkpoint.py" in out


def test_every_training_exercise_can_be_rebuilt():
    """Each exercise whose function gets a model builds, with its arguments in the signature's order
    (the finetune exercises: the model prepare_model gets, and the batch the grader trains on)."""
    for exercise_id, spec in _exercises_with_setup():
        s = vramlab.exercise_setup(exercise_id)
        assert s.function == spec.function and len(s.args) == len(s.arg_names)
        assert s.arg_names[0] in ("model", "student")
        assert s.arg_names[-1] == "batch_size" or s.batch.dim() == 2


def _exercises_with_setup():
    from vramlab.exercises import EXERCISES
    from vramlab.grader.kinds import get_kind

    return [(i, s) for i, s in EXERCISES.items() if hasattr(get_kind(s.kind), "setup")]

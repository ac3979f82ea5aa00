"""fp16 dynamic loss scaling on CPU, for real: overflow skips the step (weights, optimizer and scheduler
untouched), the scale backs off and grows as configured, storms stop the run with a clear error, the last
good checkpoint stays loadable, and the scaler state travels with checkpoints."""

from __future__ import annotations

import itertools
import json
from contextlib import contextmanager

import pytest
import torch

from ampft.benchmark import speed
from ampft.checkpointing import checkpoints, manifest, resolve_resume
from ampft.engine import TrainingDiverged, fit
from ampft.finetune import build, reset_accelerate, run

FP16 = ["precision=fp16", "trainer.log_every=1", "trainer.max_grad_norm=1.0", "scheduler=linear",
        "scheduler.warmup_steps=0", "task.max_train_samples=256"]


@pytest.fixture
def built(tiny, tmp_path):
    loops = []

    def _build(*overrides):
        loop, _, ran = build(tiny(*FP16, *overrides), tmp_path)
        assert ran == "fp16"
        loops.append(loop)
        return loop

    yield _build
    for loop in loops:
        loop.tracker.close()
    reset_accelerate()


@contextmanager
def inf_gradients(model, attempts: int | None):
    """Make the next `attempts` backward passes (None: all) produce an inf gradient."""
    calls = {"n": 0}
    param = next(p for p in model.parameters() if p.requires_grad)

    def hook(grad):
        calls["n"] += 1
        if attempts is None or calls["n"] <= attempts:
            return torch.full_like(grad, float("inf"))
        return grad

    handle = param.register_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def _snapshot(loop):
    weights = [p.detach().clone() for p in loop.model.parameters()]
    return weights, json.dumps(str(loop.optimizer.state_dict()["state"]))


def test_overflow_skips_the_step_then_training_recovers(built):
    loop = built("trainer.max_steps=3", "precision.init_scale=1024", "precision.backoff_factor=0.25")
    weights0, _ = _snapshot(loop)
    with inf_gradients(loop.model, attempts=2):
        fit(loop)
    st = loop.state
    assert (st.step, st.skipped) == (3, 2)  # 5 attempts: 2 skipped, 3 applied
    assert loop.accelerator.scaler.get_scale() == 1024 * 0.25 * 0.25
    assert loop.scheduler.scheduler.last_epoch == 3  # stepped for applied updates only
    weights1, _ = _snapshot(loop)
    assert any(not torch.equal(a, b) for a, b in zip(weights0, weights1, strict=True))  # it trained
    events = [json.loads(x) for x in (loop.run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [e for e in events if e["event"] == "train"]
    assert [e["step"] for e in train] == [1, 2, 3]
    assert train[0]["skipped_steps"] == 2 and train[0]["skipped_in_window"] == 2
    assert train[0]["loss_scale"] == 64.0 and all("grad_norm" in e for e in train)


def test_a_skipped_step_changes_nothing(built):
    loop = built("trainer.max_steps=1", "precision.init_scale=256", "precision.min_scale=1",
                 "precision.max_consecutive_nonfinite=1000")
    weights0, opt0 = _snapshot(loop)
    with inf_gradients(loop.model, attempts=None), pytest.raises(TrainingDiverged) as err:
        fit(loop)
    # Every step overflowed: nothing was applied, the scale halved each time until below min_scale.
    weights1, opt1 = _snapshot(loop)
    assert all(torch.equal(a, b) for a, b in zip(weights0, weights1, strict=True))
    assert opt1 == opt0 and not loop.optimizer.state_dict()["state"]
    assert loop.scheduler.scheduler.last_epoch == 0 and loop.state.step == 0
    assert loop.state.skipped == 9  # 256 → 0.5 in nine halvings
    msg = str(err.value)
    assert "collapsed to 0.5" in msg and "precision.min_scale=1" in msg
    assert "step 0: 256" in msg and "precision=bf16" in msg  # history and fixes


def test_scale_grows_after_growth_interval_clean_steps(built):
    loop = built("trainer.max_steps=7", "precision.init_scale=8", "precision.growth_interval=3",
                 "precision.growth_factor=4")
    fit(loop)
    assert loop.state.skipped == 0
    assert loop.accelerator.scaler.get_scale() == 8 * 4 * 4  # grown after steps 3 and 6
    scales = [json.loads(x).get("loss_scale") for x in (loop.run_dir / "metrics.jsonl").read_text().splitlines()
              if '"train"' in x]
    assert scales == [8, 8, 32, 32, 32, 128, 128]


def test_static_scale_never_moves(built):
    loop = built("trainer.max_steps=4", "precision.static_scale=128", "precision.growth_interval=1")
    with inf_gradients(loop.model, attempts=1):
        fit(loop)
    assert loop.state.skipped == 1 and loop.accelerator.scaler.get_scale() == 128


def test_the_speed_benchmark_steps_as_training_does(tiny, tmp_path):
    """Speed mode times the engine's own step: on the same batches, with the same fp16 overflow, its steps
    leave the same weights, optimizer moments, scheduler position, loss scale and skip count as `fit`."""
    overrides = [*FP16, "trainer.max_steps=3", "precision.init_scale=1024", "precision.backoff_factor=0.25"]

    def outcome(name, steps):
        training, _, ran = build(tiny(*overrides), tmp_path / name)
        assert ran == "fp16"
        try:
            with inf_gradients(training.model, attempts=1):
                skipped = steps(training)
            tensors = [p.detach().clone() for p in training.model.parameters()]
            tensors += [v for state in training.optimizer.state_dict()["state"].values() for v in state.values()]
            return (tensors, training.scheduler.scheduler.last_epoch, training.accelerator.scaler.get_scale(),
                    skipped)
        finally:
            training.tracker.close()
            reset_accelerate()

    def timed(training):  # fit's batches in fit's order: one overflow, then three applied steps
        training.train_dl.set_epoch(0)
        batches = list(itertools.islice(training.train_dl, 4))
        training.model.train()
        seconds, losses, skipped = speed._run_steps(training, batches)
        assert len(seconds) == len(losses) == 4
        return skipped

    trained = outcome("fit", lambda training: fit(training).skipped)
    benchmarked = outcome("speed", timed)
    assert trained[1:] == benchmarked[1:] == (3, 1024 * 0.25, 1)  # 3 updates scheduled, 1 skipped
    assert all(torch.equal(a, b) for a, b in zip(trained[0], benchmarked[0], strict=True))  # weights, moments


def _poison_after(monkeypatch, micro_batches: int):
    """Make the model's loss NaN from the given forward pass on (a divergence in the middle of a run)."""
    import ampft.finetune as ft

    real = ft.build_model

    def build_model(*args, **kwargs):
        model = real(*args, **kwargs)
        calls = {"n": 0}

        def poison(module, inputs, output):
            if module.training:
                calls["n"] += 1
                if calls["n"] > micro_batches:
                    output.logits = output.logits * float("nan")
                    output.loss = output.loss * float("nan")
            return output

        model.register_forward_hook(poison)
        return model

    monkeypatch.setattr(ft, "build_model", build_model)


def test_nonfinite_losses_in_a_row_stop_the_run(tiny, tmp_path, monkeypatch):
    _poison_after(monkeypatch, micro_batches=4)
    cfg = tiny("precision=fp32", "trainer.max_steps=30", "trainer.log_every=10",
               "precision.max_consecutive_nonfinite=3")
    with pytest.raises(TrainingDiverged, match=r"not finite for [3-5] optimizer steps in a row") as err:
        run(cfg, tmp_path)
    assert "precision=bf16" in str(err.value) and "optim.lr" in str(err.value)
    assert not (tmp_path / "model").exists() and not (tmp_path / "summary.json").exists()


def test_a_run_shorter_than_the_checks_still_never_ends_on_broken_weights(tiny, tmp_path, monkeypatch):
    """NaN losses for fewer steps than precision.max_consecutive_nonfinite, up to the last step: the run ends with
    the divergence error (the step, the fixes), before its final evaluation and its export."""
    _poison_after(monkeypatch, micro_batches=4)
    cfg = tiny("precision=fp32", "trainer.max_steps=8", "trainer.log_every=100",
               "precision.max_consecutive_nonfinite=10")
    with pytest.raises(TrainingDiverged, match=r"diverged at step 8: the weights are not finite at the end of the "
                                               r"run \(the last loss: nan\)") as err:
        run(cfg, tmp_path)
    assert "optim.lr" in str(err.value) and "No checkpoint of this run is known good" in str(err.value)
    events = [json.loads(x)["event"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "eval" not in events and not (tmp_path / "model").exists()


def test_divergence_keeps_the_last_good_checkpoint(tiny, tmp_path, monkeypatch):
    _poison_after(monkeypatch, micro_batches=4)
    cfg = tiny("precision=fp32", "trainer.max_steps=30", "checkpoint.every=2", "trainer.log_every=2",
               "precision.max_consecutive_nonfinite=10")
    # The losses turn NaN in step 5, the first update trained from step_4: step_4 is the checkpoint not judged yet,
    # so it is marked diverged and the error names step_2, whose weights produced the finite losses of step 3.
    with pytest.raises(TrainingDiverged, match=r"newest checkpoint known good is \S*step_2 \(step 2") as err:
        run(cfg, tmp_path)
    assert "step_4 holds the weights that produced these losses" in str(err.value)
    assert [p.name for p in checkpoints(tmp_path)] == ["step_2", "step_4"]
    assert manifest(tmp_path / "checkpoints" / "step_4")["health"]["ok"] is False
    assert manifest(tmp_path / "checkpoints" / "step_2")["health"]["ok"] is True
    assert resolve_resume(tmp_path, "latest") == tmp_path / "checkpoints" / "step_2"
    # The checkpoint known good loads and training continues from it.
    monkeypatch.undo()
    summary = run(tiny("precision=fp32", "trainer.max_steps=8", "checkpoint.resume=latest"), tmp_path)
    assert summary["steps"] == 8 and summary["eval"]["loss"] == summary["eval"]["loss"]


def test_fp16_overflow_storm_collapses_the_scale_and_stops(tiny, tmp_path, monkeypatch):
    _poison_after(monkeypatch, micro_batches=2)
    cfg = tiny(*FP16, "trainer.max_steps=30", "checkpoint.every=2", "precision.init_scale=64",
               "precision.max_consecutive_nonfinite=1000")
    with pytest.raises(TrainingDiverged, match="loss scale collapsed"):
        run(cfg, tmp_path)
    assert [p.name for p in checkpoints(tmp_path)] == ["step_2"]


def test_scaler_state_is_checkpointed_and_restored(tiny, tmp_path):
    common = [*FP16, "precision.init_scale=16", "precision.growth_interval=2", "checkpoint.every=3"]
    run(tiny(*common, "trainer.max_steps=3"), tmp_path)
    scaler = torch.load(tmp_path / "checkpoints" / "step_3" / "scaler.pt", weights_only=False)
    assert scaler["scale"] == 32.0 and scaler["_growth_tracker"] == 1  # grew at step 2, one clean step since
    # Resumed, the next clean step completes the growth interval: 32 → 64 (a fresh scaler would say 16).
    run(tiny(*common, "trainer.max_steps=4", "checkpoint.resume=latest"), tmp_path)
    last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-2])
    assert last["event"] == "train" and last["step"] == 4 and last["loss_scale"] == 64.0

"""Checkpoints that never lose work: exact resume after SIGKILL, preemption by SIGTERM/SIGUSR1, atomic
saves that `latest` can trust, refusal of config changes that break exactness, best-K rotation."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time

import pytest
import torch

from ampft.checkpointing import CheckpointError, checkpoints, manifest, rotate
from ampft.finetune import run
from ampft.tracking import format_summary
from tests.helpers import ROOT, TINY

# Per-step losses, enough steps to interrupt a real process in the middle of its run.
EXACT = [*TINY, "trainer.log_every=1", "trainer.max_steps=150", "task.max_train_samples=400",
         "checkpoint.every=20", "checkpoint.keep_last=10", "trainer.eval_every=50"]


def _recipe(run_dir, *overrides) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "recipes/finetune.py", *overrides, f"hydra.run.dir={run_dir}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _losses(run_dir) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "train":
            out.setdefault(event["step"], []).append(event["loss"])
    return out


def _wait_for_step(proc: subprocess.Popen, run_dir, step: int, timeout: float = 3600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run ended before step {step}: {proc.stderr.read()[-2000:]}")
        metrics = run_dir / "metrics.jsonl"
        if metrics.is_file() and any(f'"step": {step},' in x for x in metrics.read_text().splitlines()):
            return
        time.sleep(0.01)
    raise AssertionError(f"step {step} not reached in {timeout}s")


def _finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_sigkill_then_resume_matches_the_uninterrupted_run_exactly(tmp_path, precision):
    args = [*EXACT, f"precision={precision}"]
    reference = _finish(_recipe(tmp_path / "ref", *args))
    assert reference.returncode == 0, reference.stderr[-2000:]

    killed = tmp_path / "killed"
    proc = _recipe(killed, *args)
    _wait_for_step(proc, killed, 70)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    resumed_from = checkpoints(killed)[-1]
    assert manifest(resumed_from)["step"] >= 60

    resumed = _finish(_recipe(killed, *args, "checkpoint.resume=latest"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    ref, got = _losses(tmp_path / "ref"), _losses(killed)
    assert sorted(got) == sorted(ref) == list(range(1, 151))
    for step, values in got.items():  # steps logged twice (before the kill and after resume) agree too
        assert all(v == ref[step][0] for v in values), f"step {step}: {values} != {ref[step]}"
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["steps"] == 150
    assert summary["eval"] == json.loads((tmp_path / "ref" / "summary.json").read_text())["eval"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_preemption_signal_checkpoints_at_the_next_step_and_exits(tmp_path, sig):
    args = [*EXACT, "checkpoint.every=0"]  # no periodic checkpoints: the signal alone must save
    proc = _recipe(tmp_path, *args)
    _wait_for_step(proc, tmp_path, 30)
    proc.send_signal(sig)
    done = _finish(proc)
    assert done.returncode == 75, done.stderr[-2000:]
    assert "checkpoint.resume=latest" in done.stderr
    saved = checkpoints(tmp_path)
    assert len(saved) == 1
    stopped_at = manifest(saved[0])["step"]
    assert 30 <= stopped_at < 150
    assert not (tmp_path / "summary.json").exists()

    resumed = _finish(_recipe(tmp_path, *args, "checkpoint.resume=latest"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 150


def test_resume_refuses_breaking_config_changes(tiny, tmp_path):
    run(tiny("trainer.max_steps=4", "checkpoint.every=4"), tmp_path)
    with pytest.raises(CheckpointError) as err:
        run(tiny("trainer.max_steps=8", "trainer.batch_size=8", "precision=bf16", "checkpoint.resume=latest"),
            tmp_path)
    msg = str(err.value)
    assert "trainer.batch_size: 16 -> 8" in msg and "precision.name: 'fp32' -> 'bf16'" in msg
    assert "checkpoint.allow_config_change=true" in msg
    # Harmless changes are allowed, and the explicit flag lets a breaking one through.
    summary = run(tiny("trainer.max_steps=6", "trainer.log_every=2", "trainer.eval_every=3",
                       "checkpoint.resume=latest"), tmp_path)
    assert summary["steps"] == 6 and summary["resumed_from"] == str(tmp_path / "checkpoints" / "step_4")
    # The training time is the line's, from step 0: the summary says so, next to this process's wall time.
    assert "s since resuming from step_4 (training" in format_summary(summary)
    summary = run(tiny("trainer.max_steps=8", "trainer.batch_size=8", "checkpoint.resume=latest",
                       "checkpoint.allow_config_change=true"), tmp_path)
    assert summary["steps"] == 8


def test_resume_on_another_number_of_processes_is_refused_unless_allowed(tiny, tmp_path):
    """The checkpoint records the world size it was trained on; another one changes the global batch (and the
    data each rank sees), so a resume refuses it like other exactness-breaking changes. The manifest is
    rewritten as a 2-process run would have written it (resealed); tests/distributed resumes on 2 real ranks."""
    from ampft.checkpointing import write_manifest

    run(tiny("trainer.max_steps=4", "checkpoint.every=4"), tmp_path)
    ckpt = tmp_path / "checkpoints" / "step_4"
    assert manifest(ckpt)["world_size"] == 1
    write_manifest(ckpt, {**manifest(ckpt), "world_size": 2})
    with pytest.raises(CheckpointError, match=r"processes \(world size\): 2 -> 1, so the global batch: 32 -> 16 "
                                              r"examples per update"):
        run(tiny("trainer.max_steps=6", "checkpoint.resume=latest"), tmp_path)
    summary = run(tiny("trainer.max_steps=6", "checkpoint.resume=latest", "checkpoint.allow_config_change=true"),
                  tmp_path)
    assert summary["steps"] == 6


@pytest.mark.parametrize("dist, written_by", [("fsdp", "FSDP2"), ("deepspeed-z2", "DeepSpeed ZeRO-1/2"),
                                               ("deepspeed-z3", "DeepSpeed ZeRO-3")])
def test_resume_under_another_distributed_backend_is_refused_even_when_allowed(tiny, tmp_path, dist, written_by):
    """Each backend writes its own checkpoint files (Accelerate's, DeepSpeed's per ZeRO stage, FSDP2's DCP
    shards): a checkpoint resumed under another would fail deep in that backend's loader, so it is refused, naming
    both and the distributed= that loads it. (ZeRO-1 and 2 write the same files: one reads the other's.)"""
    from ampft.checkpointing import check_config
    from ampft.config import to_plain

    run(tiny("trainer.max_steps=4", "checkpoint.every=4"), tmp_path)
    ckpt = tmp_path / "checkpoints" / "step_4"
    for allow in (False, True):
        with pytest.raises(CheckpointError) as err:
            check_config(ckpt, to_plain(tiny(f"distributed={dist}")), allow)
        assert str(err.value) == (
            f"checkpoint {ckpt} was written by one process or DDP (distributed=single) and cannot be loaded by "
            f"{written_by} (distributed={dist}): each backend reads only its own checkpoint files; resume with "
            "distributed=single")
    assert check_config(ckpt, to_plain(tiny("distributed=ddp")), False) == []  # DDP reads one process's files


def test_an_allowed_new_batch_size_goes_on_after_the_examples_already_trained_on(tiny, tmp_path, caplog):
    """8 steps of batch 16 have consumed 128 of the epoch's 640 examples; resumed with batch 32 (allowed), the
    epoch goes on after those 128 (4 batches of 32), not after 8 batches of 32."""
    run(tiny("trainer.max_steps=8", "checkpoint.every=8", "trainer.log_every=1"), tmp_path)
    with caplog.at_level(logging.WARNING, logger="ampft.finetune"):
        run(tiny("trainer.max_steps=10", "trainer.batch_size=32", "trainer.log_every=1", "checkpoint.resume=latest",
                 "checkpoint.allow_config_change=true"), tmp_path)
    assert "the epoch goes on after its 128 examples already trained on (16 per step before, 32 now)" in caplog.text
    epochs = {json.loads(x)["step"]: json.loads(x)["epoch"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
              if '"train"' in x}
    assert epochs[8] == 128 / 640 and epochs[9] == (128 + 32) / 640 and epochs[10] == (128 + 64) / 640


def _write_tsv(path, rows):
    path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))


def test_training_data_changed_under_the_same_path_is_refused_on_resume(tmp_path):
    """The checkpoint records the training file's content digest: a file rewritten in place (same path) between
    the save and the resume is a change that breaks exactness; the same content under another path is not."""
    from ampft.data.demo import demo_splits
    from tests.helpers import compose_config

    demo = demo_splits(200, 50)
    rows = list(zip(demo["train"]["sentence"], demo["train"]["label"], strict=True))
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    _write_tsv(train, rows)
    _write_tsv(dev, zip(demo["validation"]["sentence"], demo["validation"]["label"], strict=True))

    def cfg(*overrides, train_file=train):
        return compose_config("finetune", [*TINY, "task=csv", f"task.train_file={train_file}",
                                           f"task.validation_file={dev}", "task.metrics=[accuracy]", *overrides])

    run_dir = tmp_path / "run"
    run(cfg("trainer.max_steps=4", "checkpoint.every=4"), run_dir)
    _write_tsv(train, rows[::-1])  # the same rows, another order: another run from here on
    with pytest.raises(CheckpointError) as err:
        run(cfg("trainer.max_steps=6", "checkpoint.resume=latest"), run_dir)
    assert f"task.train_file={train}: its content is not what the checkpoint trained on" in str(err.value)
    moved = tmp_path / "moved.tsv"
    _write_tsv(moved, rows)  # the original content under another path: the same data
    summary = run(cfg("trainer.max_steps=6", "checkpoint.resume=latest", train_file=moved), run_dir)
    assert summary["steps"] == 6


def test_allowed_optimizer_and_loss_scale_changes_take_effect_on_resume(tiny, tmp_path):
    """Loading a checkpoint puts back the optimizer's settings and the fp16 loss scaler's; allowed changes to them
    must be what the resumed run trains with."""
    from ampft.finetune import build, reset_accelerate

    run(tiny("precision=fp16", "trainer.max_steps=4", "checkpoint.every=4", "checkpoint.export=false"), tmp_path)
    training, _, _ = build(tiny("precision=fp16", "trainer.max_steps=8", "optim.weight_decay=0.1",
                                "optim.betas=[0.8,0.9]", "optim.eps=1e-6", "optim.lr=2e-3", "precision.init_scale=256",
                                "precision.growth_interval=7", "checkpoint.resume=latest",
                                "checkpoint.allow_config_change=true"), tmp_path)
    try:
        decay, no_decay = training.optimizer.param_groups
        assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
        assert all(g["betas"] == (0.8, 0.9) and g["eps"] == 1e-6 and g["initial_lr"] == 2e-3 for g in (decay, no_decay))
        sched = training.scheduler.scheduler
        assert sched.base_lrs == [2e-3, 2e-3] and sched.last_epoch == 4
        assert decay["lr"] == pytest.approx(2e-3 * sched.lr_lambdas[0](4), rel=1e-12)
        scaler = training.accelerator.scaler
        assert scaler.get_scale() == 256 and scaler.get_growth_interval() == 7
    finally:
        training.tracker.close()
        reset_accelerate()


def test_latest_skips_incomplete_and_corrupt_checkpoints(tiny, tmp_path, caplog):
    run(tiny("trainer.max_steps=6", "checkpoint.every=2", "checkpoint.keep_last=5", "trainer.log_every=1"), tmp_path)
    root = tmp_path / "checkpoints"
    # A save killed midway (temporary folder) and a checkpoint whose weights were truncated.
    (root / "step_8.tmp").mkdir()
    (root / "step_8.tmp" / "model.safetensors").write_bytes(b"partial")
    weights = root / "step_6" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="ampft.checkpointing"):
        summary = run(tiny("trainer.max_steps=8", "checkpoint.every=2", "checkpoint.keep_last=5",
                           "trainer.log_every=1", "checkpoint.resume=latest"), tmp_path)
    assert summary["steps"] == 8
    text = caplog.text
    assert "step_8.tmp" in text and "unfinished save" in text
    assert "step_6" in text and "model.safetensors is 100 bytes" in text
    # Resumed from step_4, the newest that verifies: steps 5 and 6 ran again; metrics.jsonl holds them once
    # (the replaced entries moved to metrics.replaced.jsonl).
    logged = _losses(tmp_path)
    assert all(len(v) == 1 for v in logged.values()) and sorted(logged) == list(range(1, 9))
    replaced = [json.loads(x)["step"] for x in (tmp_path / "metrics.replaced.jsonl").read_text().splitlines()]
    assert replaced and set(replaced) <= {5, 6}


def test_corrupt_checkpoint_by_path_is_a_clear_error(tiny, tmp_path):
    run(tiny("trainer.max_steps=2", "checkpoint.every=2"), tmp_path)
    ckpt = tmp_path / "checkpoints" / "step_2"
    (ckpt / "optimizer.bin").unlink()
    with pytest.raises(CheckpointError, match=r"step_2 cannot be loaded: optimizer.bin is missing"):
        run(tiny("trainer.max_steps=4", f"checkpoint.resume={ckpt}"), tmp_path / "other")


def test_rotation_keeps_last_k_and_best_k(tmp_path):
    def fake(step, value):
        p = tmp_path / f"step_{step}"
        p.mkdir()
        (p / "manifest.json").write_text(json.dumps({"step": step, "metric": {"name": "accuracy", "value": value},
                                                     "files": {}}))
        return p

    found = [fake(s, v) for s, v in [(1, 0.5), (2, 0.9), (3, 0.7), (4, 0.6), (5, 0.65)]]
    assert [p.name for p in rotate(found, keep_last=2, keep_best=1, mode="max")] == ["step_1", "step_3"]
    assert [p.name for p in rotate(found, keep_last=1, keep_best=2, mode="min")] == ["step_2", "step_3"]


def test_best_checkpoint_is_exported_with_a_model_card(tiny, tmp_path):
    from transformers import AutoModelForSequenceClassification

    summary = run(tiny("trainer.max_steps=12", "checkpoint.every=3", "checkpoint.keep_last=1",
                       "checkpoint.keep_best=1", "checkpoint.metric=loss", "checkpoint.mode=min",
                       "checkpoint.export_best=true"), tmp_path)
    kept = checkpoints(tmp_path)
    best = min(kept, key=lambda p: manifest(p)["metric"]["value"])
    assert summary["exported"].startswith(f"best: {best.name}")
    exported = AutoModelForSequenceClassification.from_pretrained(tmp_path / "model")
    from safetensors.torch import load_file

    saved = load_file(best / "model.safetensors")
    for name, tensor in exported.state_dict().items():
        if name in saved:
            assert torch.equal(tensor, saved[name]), name
    card = (tmp_path / "model" / "README.md").read_text()
    assert "tiny-bert fine-tuned on demo" in card and "fp32" in card and "samples/s" in card


def test_model_card_records_the_command(tmp_path):
    proc = _finish(_recipe(tmp_path, *TINY, "trainer.max_steps=3", "optim.lr=2e-4"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    card = (tmp_path / "model" / "README.md").read_text()
    assert "python recipes/finetune.py" in card and "optim.lr=2e-4" in card



def test_a_resume_with_more_steps_trains_its_first_step_at_the_new_schedules_lr(tiny, tmp_path):
    """trainer.max_steps may change on resume: the schedule is rebuilt for the new length, and the first step after
    the resume uses its lr, not the one the checkpoint's optimizer held (0 at the end of a finished linear run)."""
    run(tiny("trainer.max_steps=4", "checkpoint.every=4", "checkpoint.export=false", "trainer.log_every=1"), tmp_path)
    run(tiny("trainer.max_steps=8", "checkpoint.resume=latest", "checkpoint.export=false", "trainer.log_every=1"),
        tmp_path)
    lrs = {e["step"]: e["lr"] for e in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
           if e["event"] == "train"}
    # linear, 1 warm-up step of 8 (warmup_ratio 0.1): the update of step n uses lr x (8 - (n - 1)) / 7
    assert [lrs[n] for n in range(5, 9)] == pytest.approx([1e-3 * (9 - n) / 7 for n in range(5, 9)], rel=1e-9)

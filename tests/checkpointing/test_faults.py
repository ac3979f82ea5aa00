"""Fault injection on checkpoints: kills during a save, corrupted files of every kind, resume from an
earlier step then preemption, a full disk, a crafted pickle, exploding losses. Each asserts what the user
sees and that nothing already saved was lost."""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from ampft import checkpointing
from ampft.checkpointing import CheckpointError, checkpoints, manifest, resolve_resume, verify
from ampft.config import ConfigError, metric_mode
from ampft.engine import Preempted, TrainingDiverged, TrainState
from ampft.finetune import run
from ampft.tracking import Tracker
from ampft.validation import validate
from tests.helpers import ROOT, TINY, compose_config

SMALL = [*TINY, "trainer.log_every=1", "checkpoint.every=2"]


def _tiny(*overrides):
    return compose_config("finetune", [*SMALL, *overrides])


def _entries(run_dir: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(x) for x in (run_dir / name).read_text().splitlines()]


def _losses(run_dir: Path) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for e in _entries(run_dir):
        if e["event"] == "train":
            out.setdefault(e["step"], []).append(e["loss"])
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A real run dir with two real checkpoints, step_2 and step_4 (copied by each test that breaks it)."""
    run_dir = tmp_path_factory.mktemp("saved")
    run(_tiny("trainer.max_steps=4", "checkpoint.keep_last=2"), run_dir)
    assert [p.name for p in checkpoints(run_dir)] == ["step_2", "step_4"]
    return run_dir


def _copy(saved: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(saved, dst)
    return dst


# -- integrity: every file kind, every kind of damage --------------------------------------------------

KINDS = ["model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl", "train_state.json",
         "config.yaml", "manifest.json"]


@pytest.mark.parametrize("damage", ["truncated", "same-size garbage", "missing"])
@pytest.mark.parametrize("kind", KINDS)
def test_latest_falls_back_past_any_damaged_file(saved, tmp_path, caplog, kind, damage):
    run_dir = _copy(saved, tmp_path)
    f = run_dir / "checkpoints" / "step_4" / kind
    data = f.read_bytes()
    if damage == "truncated":
        f.write_bytes(data[: len(data) // 2])
    elif damage == "same-size garbage":
        f.write_bytes(bytes(len(data)))  # zero-filled, as a failing disk or a bad copy leaves it
    else:
        f.unlink()
    with caplog.at_level(logging.WARNING, logger="ampft.checkpointing"):
        chosen = resolve_resume(run_dir, "latest")
    assert chosen == run_dir / "checkpoints" / "step_2"
    assert "skipping" in caplog.text and "step_4" in caplog.text
    if kind != "manifest.json":
        assert kind in caplog.text  # the message names the damaged file
    with pytest.raises(CheckpointError, match="step_4 cannot be loaded") as err:
        resolve_resume(run_dir, str(run_dir / "checkpoints" / "step_4"))
    offered = str(err.value).split("Other complete checkpoints of this run")[1]
    assert "step_2" in offered and "step_4" not in offered  # never the one just refused


def test_same_size_corruption_resumes_from_the_previous_checkpoint(saved, tmp_path, caplog):
    """The issue's crash: a zero-filled model.safetensors of the newest checkpoint."""
    run_dir = _copy(saved, tmp_path)
    weights = run_dir / "checkpoints" / "step_4" / "model.safetensors"
    weights.write_bytes(bytes(weights.stat().st_size))
    # Leftovers of an interrupted save and an interrupted deletion: cleaned up by the next save.
    (run_dir / "checkpoints" / "step_6.tmp").mkdir()
    (run_dir / "checkpoints" / "step_6.tmp" / "optimizer.bin").write_bytes(b"partial")
    shutil.copytree(run_dir / "checkpoints" / "step_2", run_dir / "checkpoints" / "step_0.deleting")
    with caplog.at_level(logging.INFO):
        summary = run(_tiny("trainer.max_steps=6", "checkpoint.keep_last=5", "checkpoint.resume=latest"), run_dir)
    assert summary["steps"] == 6
    assert "does not match its sha256 checksum" in caplog.text
    assert f"resumed from {run_dir / 'checkpoints' / 'step_2'} at step 2" in caplog.text
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["line.json", "step_2", "step_4", "step_6"]  # no .tmp, no .deleting; the new step_4 replaced
    # the bad one; line.json: where the resume started its line
    assert not verify(run_dir / "checkpoints" / "step_4")
    assert manifest(run_dir / "checkpoints" / "step_4")["parent"]["name"] == "step_2"


def test_an_edited_manifest_is_never_trusted(saved, tmp_path, caplog):
    """The manifest seals its own keys: a `seq` edited by hand (to make an old checkpoint look newest) or a
    manifest from before the seal is skipped by `latest` and refused by path, naming why."""
    run_dir = _copy(saved, tmp_path)
    step_2, step_4 = run_dir / "checkpoints" / "step_2", run_dir / "checkpoints" / "step_4"
    body = manifest(step_2)
    body["seq"] = 99
    (step_2 / "manifest.json").write_text(json.dumps(body))
    assert verify(step_2) == ["manifest.json does not match its own manifest_sha256 (edited or corrupted after "
                              "the save): its step, lineage and checksums cannot be trusted"]
    assert checkpoints(run_dir) == [step_4]
    with pytest.raises(CheckpointError, match="step_2 cannot be loaded: manifest.json does not match its own"):
        resolve_resume(run_dir, str(step_2))
    body = manifest(step_4)
    del body["manifest_sha256"]
    (step_4 / "manifest.json").write_text(json.dumps(body))
    with caplog.at_level(logging.WARNING, logger="ampft.checkpointing"):
        assert resolve_resume(run_dir, "latest") is None
    assert "step_4: manifest.json has no manifest_sha256" in caplog.text and "step_2" in caplog.text


# -- kill -9 inside a save, at each point ---------------------------------------------------------------

EXACT = [*TINY, "trainer.log_every=1", "trainer.max_steps=12", "task.max_train_samples=320",
         "checkpoint.every=2", "checkpoint.keep_last=2", "trainer.eval_every=6"]


def _recipe(run_dir: Path, *args: str, killer: str | None = None) -> subprocess.Popen:
    head = [sys.executable, "tests/checkpointing/kill_during_save.py", killer] if killer else [sys.executable,
                                                                                       "recipes/finetune.py"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    return subprocess.Popen([*head, *args, f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # Hydra logs to stdout


@pytest.mark.slow
def test_kill_at_each_point_of_a_save_then_resume_matches_the_uninterrupted_run(tmp_path):
    reference = _recipe(tmp_path / "ref", *EXACT)  # runs alongside the chain below
    run_dir = tmp_path / "killed"
    chain = [("file:step_4.tmp/optimizer.bin", []),  # weights written, optimizer not yet
             ("renaming:step_6.tmp", ["checkpoint.resume=latest"]),  # complete, not renamed
             ("deleting:step_2", ["checkpoint.resume=latest"])]  # rotation half-way through a deletion
    expected_resume = [None, "step_2", "step_4"]
    for (killer, extra), resumed_from in zip(chain, expected_resume, strict=True):
        proc = _recipe(run_dir, *EXACT, *extra, killer=killer)
        err, _ = proc.communicate()
        assert proc.returncode == -signal.SIGKILL, err[-3000:]
        if resumed_from:
            assert f"resumed from {run_dir / 'checkpoints' / resumed_from}" in err, err[-3000:]
        good = checkpoints(run_dir)
        assert good and all(not verify(p) for p in good)  # every complete checkpoint verifies byte for byte
    left = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert "step_2.deleting" in left and "step_6" in left
    final = _recipe(run_dir, *EXACT, "checkpoint.resume=latest")
    err, _ = final.communicate()
    assert final.returncode == 0, err[-3000:]
    assert f"resumed from {run_dir / 'checkpoints' / 'step_6'}" in err
    ref_err, _ = reference.communicate()
    assert reference.returncode == 0, ref_err[-3000:]

    ref, got = _losses(tmp_path / "ref"), _losses(run_dir)
    assert sorted(got) == sorted(ref) == list(range(1, 13))
    assert all(len(v) == 1 for v in got.values())  # one clean history, no replayed duplicates
    assert got == ref  # bit for bit, as if never interrupted
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval"] == json.loads((tmp_path / "ref" / "summary.json").read_text())["eval"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["line.json", "step_10", "step_12"]
    replaced = _entries(run_dir, "metrics.replaced.jsonl")  # what the killed runs logged past their checkpoint
    assert replaced and all(e["step"] > 2 for e in replaced)


# -- timelines: resume from an earlier step, preemption ------------------------------------------------

def _sigterm_after_first_train_log(monkeypatch):
    real = Tracker.log

    def log(self, event, step, values):
        real(self, event, step, values)
        if event == "train" and not getattr(self, "_signalled", False):
            self._signalled = True
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Tracker, "log", log)


def test_ctrl_c_checkpoints_at_the_next_step_and_a_second_one_stops_at_once(tmp_path, monkeypatch):
    from ampft.engine import preemption_signals

    real = Tracker.log

    def log(self, event, step, values):
        real(self, event, step, values)
        if event == "train" and step == 2:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(Tracker, "log", log)
    with pytest.raises(Preempted, match=r"stopped by SIGINT at step 2; checkpoint written: .*step_2"):
        run(_tiny("trainer.max_steps=40", "trainer.log_every=2", "checkpoint.export=false"), tmp_path)
    assert [p.name for p in checkpoints(tmp_path)] == ["step_2"]
    before = signal.getsignal(signal.SIGINT)
    with preemption_signals() as flag:
        os.kill(os.getpid(), signal.SIGINT)
        assert flag["signal"] == "SIGINT"  # the first: a checkpoint at the next step boundary
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_resume_from_an_earlier_step_then_preemption_keeps_the_new_line(saved, tmp_path, monkeypatch):
    """The issue's repro: 10 steps (every=2, keep_last=5), then resume step_4 with every=4 keep_last=2,
    SIGTERM after the first new log line."""
    run_dir = tmp_path / "run"
    run(_tiny("trainer.max_steps=10", "checkpoint.keep_last=5", "trainer.log_every=2"), run_dir)
    assert [p.name for p in checkpoints(run_dir)] == [f"step_{s}" for s in (2, 4, 6, 8, 10)]

    _sigterm_after_first_train_log(monkeypatch)
    with pytest.raises(Preempted, match=r"at step 6; checkpoint written: .*step_6"):
        run(_tiny("trainer.max_steps=40", "trainer.log_every=2", "checkpoint.every=4", "checkpoint.keep_last=2",
                  f"checkpoint.resume={run_dir / 'checkpoints' / 'step_4'}"), run_dir)
    monkeypatch.undo()
    # The new line (4 -> 6) is kept; the abandoned step_8 and step_10 went first.
    assert [p.name for p in checkpoints(run_dir)] == ["step_4", "step_6"]
    new6 = manifest(run_dir / "checkpoints" / "step_6")
    assert new6["parent"] == {"name": "step_4", "seq": manifest(run_dir / "checkpoints" / "step_4")["seq"]}
    assert resolve_resume(run_dir, "latest") == run_dir / "checkpoints" / "step_6"
    # metrics.jsonl: one history (1..6 of the line going on); the abandoned 5..10 moved aside.
    steps = [e["step"] for e in _entries(run_dir) if e["event"] == "train"]
    assert steps == [2, 4, 6]
    assert {e["step"] for e in _entries(run_dir, "metrics.replaced.jsonl")} >= {6, 8, 10}

    summary = run(_tiny("trainer.max_steps=8", "trainer.log_every=2", "checkpoint.every=4", "checkpoint.keep_last=2",
                        "checkpoint.resume=latest"), run_dir)
    assert summary["steps"] == 8
    assert [p.name for p in checkpoints(run_dir)] == ["step_6", "step_8"]


def test_a_line_started_by_a_resume_goes_on_before_its_first_save(saved, tmp_path):
    """The marker a resume writes when it starts decides the line going on until its first save; its first
    save then continues from it (seq past the marker's)."""
    run_dir = _copy(saved, tmp_path)
    step_2, step_4 = run_dir / "checkpoints" / "step_2", run_dir / "checkpoints" / "step_4"
    checkpointing.mark_line(run_dir, step_2, "r1")
    assert checkpoints(run_dir) == [step_4, step_2] and resolve_resume(run_dir, "latest") == step_2
    marker = json.loads((run_dir / "checkpoints" / "line.json").read_text())
    assert marker["seq"] > manifest(step_4)["seq"] and marker["parent"]["name"] == "step_2"
    checkpointing.mark_line(run_dir, None, "r2")  # a new run in the reused folder: nothing to resume yet
    assert resolve_resume(run_dir, "latest") is None


@pytest.mark.slow
def test_a_kill_before_the_first_save_of_a_new_line_resumes_that_line(tmp_path):
    """A run to step 10 (checkpoints 4 and 8), resumed from step_4 on another line (max_steps=12: another
    schedule), killed with -9 at step 6, before that line's first save. The line going on is the one that
    resume started: `latest` is step_4, not the abandoned line's step_8, and finishing it gives exactly the
    losses of that line run without a kill, one history in metrics.jsonl (the killed run's lock is taken over)."""
    args = [*TINY, "checkpoint.every=4", "checkpoint.keep_last=5", "trainer.log_every=1"]
    run_dir, ref = tmp_path / "run", tmp_path / "ref"
    first = _recipe(run_dir, *args, "trainer.max_steps=10")
    assert first.wait() == 0, first.stdout.read()[-3000:]
    shutil.copytree(run_dir, ref)
    reference = _recipe(ref, *args, "trainer.max_steps=12", f"checkpoint.resume={ref / 'checkpoints' / 'step_4'}")
    step_4 = run_dir / "checkpoints" / "step_4"
    killed = _recipe(run_dir, *args, "trainer.max_steps=12", f"checkpoint.resume={step_4}", killer="step:6")
    out, _ = killed.communicate()
    assert killed.returncode == -signal.SIGKILL, out[-3000:]
    assert [p.name for p in checkpoints(run_dir)] == ["step_8", "step_4"]  # step_8: off the line going on
    assert resolve_resume(run_dir, "latest") == step_4
    resumed = _recipe(run_dir, *args, "trainer.max_steps=12", "checkpoint.resume=latest")
    out, _ = resumed.communicate()
    assert resumed.returncode == 0, out[-3000:]
    assert f"resumed from {step_4} at step 4" in out and "taking over the lock of a run that is gone" in out
    ref_out, _ = reference.communicate()
    assert reference.returncode == 0, ref_out[-3000:]
    assert _losses(run_dir) == _losses(ref)
    assert json.loads((run_dir / "summary.json").read_text())["eval"] == json.loads((ref / "summary.json").read_text())["eval"]


@pytest.mark.parametrize("best", [[], ["checkpoint.keep_best=1"]])
def test_resuming_at_an_epoch_end_logs_its_evaluation_once(tmp_path, best):
    """160 examples, batch 16: 10 steps an epoch. A checkpoint at the epoch's last step, then the evaluation
    (after the save; with keep_best, before it, at the save): resumed there, the run evaluates that step again
    only when the checkpoint does not hold the evaluation; either way metrics.jsonl has each evaluation once."""
    args = ["task.max_train_samples=160", "checkpoint.every=10", "trainer.log_every=5", *best]
    run(_tiny("trainer.max_steps=10", *args), tmp_path)
    run(_tiny("trainer.max_steps=20", *args, "checkpoint.resume=latest"), tmp_path)
    assert [e["step"] for e in _entries(tmp_path) if e["event"] == "eval"] == [10, 20]
    assert [e["step"] for e in _entries(tmp_path) if e["event"] == "train"] == [5, 10, 15, 20]


def test_preemption_on_a_checkpoint_step_saves_it_once(tmp_path, monkeypatch):
    saves = []
    real = checkpointing.save

    def save(accelerator, run_dir, step, *args, **kwargs):
        saves.append(step)
        return real(accelerator, run_dir, step, *args, **kwargs)

    monkeypatch.setattr(checkpointing, "save", save)
    _sigterm_after_first_train_log(monkeypatch)
    with pytest.raises(Preempted, match="at step 2"):
        run(_tiny("trainer.max_steps=10", "trainer.log_every=2"), tmp_path)
    assert saves == [2]
    assert [p.name for p in checkpoints(tmp_path)] == ["step_2"]


def test_symlinked_checkpoints_lose_their_link_only_when_rotated_or_replaced(saved, tmp_path, caplog):
    """Checkpoints moved to another disk and linked back: the new line re-saves step_4 (the abandoned line's,
    a link) and rotation drops step_2 (a link); each loses its link, what they point to stays whole."""
    run_dir = _copy(saved, tmp_path)
    elsewhere = tmp_path / "other-disk"
    elsewhere.mkdir()
    for name in ("step_2", "step_4"):
        (run_dir / "checkpoints" / name).rename(elsewhere / name)
        (run_dir / "checkpoints" / name).symlink_to(elsewhere / name, target_is_directory=True)
    kept = {n: manifest(elsewhere / n) for n in ("step_2", "step_4")}
    with caplog.at_level(logging.WARNING, logger="ampft.checkpointing"):
        summary = run(_tiny("trainer.max_steps=6", "checkpoint.keep_last=2",
                            f"checkpoint.resume={run_dir / 'checkpoints' / 'step_2'}"), run_dir)
    assert summary["steps"] == 6
    assert [p.name for p in checkpoints(run_dir)] == ["step_4", "step_6"]
    assert not any(p.is_symlink() for p in (run_dir / "checkpoints").iterdir())  # step_4 is the new line's own
    assert manifest(run_dir / "checkpoints" / "step_4")["parent"]["name"] == "step_2"
    for name, body in kept.items():  # the targets: untouched, every byte
        assert manifest(elsewhere / name) == body and not verify(elsewhere / name)
    said = caplog.text
    assert f"removing the link {run_dir / 'checkpoints' / 'step_2.deleting'}" in said
    assert f"removing the link {run_dir / 'checkpoints' / 'step_4.deleting'}" in said
    assert str(elsewhere / "step_2") in said and "is left as it is" in said


# -- a full disk ---------------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path, saved):
    """A tmpfs with room for the run's files and one checkpoint, not two (root only)."""
    ckpt = sum(manifest(saved / "checkpoints" / "step_2")["files"].values())
    others = sum(f.stat().st_size for f in saved.rglob("*") if f.is_file() and "checkpoints" not in f.parts
                 and "model" not in f.parts)
    mount = tmp_path / "disk"
    mount.mkdir()
    size = others + int(1.6 * ckpt)
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                              capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command")
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {proc.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_disk_is_a_clear_error_and_the_previous_checkpoint_survives(small_disk):
    run_dir = small_disk / "run"
    with pytest.raises(CheckpointError) as err:
        run(_tiny("trainer.max_steps=8", "checkpoint.keep_last=1", "checkpoint.export=false"), run_dir)
    msg = str(err.value)
    assert "could not write checkpoint step_4" in msg and str(run_dir) in msg
    assert "free space there" in msg and "needs about" in msg and "disk is full" in msg
    assert "checkpoint.resume=latest" in msg
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_2"]  # no half-written step_4.tmp
    assert not verify(run_dir / "checkpoints" / "step_2")


@pytest.fixture
def tmpfs(tmp_path):
    """mount(name, size in bytes) -> a fresh tmpfs of that size under tmp_path (root only, else the test skips)."""
    mounted = []

    def mount(name: str, size: int) -> Path:
        path = tmp_path / name
        path.mkdir()
        try:
            proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                  capture_output=True, text=True)
        except FileNotFoundError:
            pytest.skip("no mount command")
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs (needs root): {proc.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _exported_weights(monkeypatch) -> dict:
    """The weights each export is given, as the run had them (to compare with what was kept)."""
    seen = {}
    real = checkpointing.export

    def export(accelerator, model, *args, **kwargs):
        seen.update({k: v.detach().clone() for k, v in accelerator.get_state_dict(model).items()})
        return real(accelerator, model, *args, **kwargs)

    monkeypatch.setattr(checkpointing, "export", export)
    return seen


def test_full_disk_at_export_keeps_the_trained_weights_elsewhere_and_says_where(tmpfs, tmp_path, monkeypatch):
    """No checkpoint, a run dir with room for the run (about 0.8 MB) but not its 9 MB model: the export fails,
    the weights go to $TMPDIR, the error says where, and the partial model/ folder is gone."""
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    run_dir = tmpfs("disk", 3 * 2**20) / "run"
    rescue_root = tmp_path / "tmpdir"
    rescue_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(rescue_root))
    weights = _exported_weights(monkeypatch)
    with pytest.raises(CheckpointError) as err:
        run(_tiny("trainer.max_steps=4", "checkpoint.every=0"), run_dir)
    msg = str(err.value)
    (rescued,) = rescue_root.iterdir()
    assert f"could not export the model to {run_dir / 'model'}" in msg and "(the disk is full)" in msg
    assert "free space there" in msg and "the model's weights need about" in msg
    assert f"The trained weights (step 4) are saved in {rescued} instead" in msg and "Free some space" in msg
    assert not (run_dir / "model").exists()  # nothing half-written that could be loaded as the model
    kept = load_file(rescued / "model.safetensors")
    assert kept.keys() == weights.keys() and all(torch.equal(kept[k], weights[k]) for k in kept)
    AutoModelForSequenceClassification.from_pretrained(rescued)  # a complete model folder
    AutoTokenizer.from_pretrained(rescued)


def test_full_disk_at_export_with_no_room_anywhere_says_the_weights_are_lost(tmpfs, monkeypatch):
    disk = tmpfs("disk", 3 * 2**20)
    monkeypatch.setattr(tempfile, "tempdir", str(disk))  # $TMPDIR on the same full disk
    with pytest.raises(CheckpointError) as err:
        run(_tiny("trainer.max_steps=4", "checkpoint.every=0"), disk / "run")
    msg = str(err.value)
    assert "No checkpoint of this run exists and no other disk had room: the trained weights (step 4) are lost" in msg
    assert "checkpoint.every=N" in msg
    assert sorted(p.name for p in disk.iterdir()) == ["run"] and not (disk / "run" / "model").exists()


def test_full_disk_at_export_of_the_best_checkpoint_says_it_is_intact(tmpfs, monkeypatch):
    """checkpoint.export_best: the weights being exported are a checkpoint's; it is named, nothing is lost.
    The disk holds the run and its checkpoints (keep_last=1) but not the model as well."""
    disk = tmpfs("disk", 80 * 2**20)
    run_dir = disk / "run"
    real = checkpointing.export

    def fill_then_export(*args, **kwargs):  # leave less room than the model needs
        free = shutil.disk_usage(disk).free
        (disk / "filler").write_bytes(b"\0" * max(0, free - 2**20))
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpointing, "export", fill_then_export)
    with pytest.raises(CheckpointError) as err:
        run(_tiny("trainer.max_steps=4", "checkpoint.keep_last=1", "checkpoint.keep_best=1",
                  "checkpoint.export_best=true", "trainer.eval_every=2"), run_dir)
    msg = str(err.value)
    assert "These weights are checkpoint " in msg and "which is intact: nothing is lost" in msg
    named = Path(msg.split("These weights are checkpoint ")[1].split("'s,")[0])
    assert named.parent == run_dir / "checkpoints" and not verify(named)


def test_a_full_cache_disk_trains_from_memory_with_a_warning(tmpfs, tmp_path, caplog):
    cache = tmpfs("cache", 64 * 2**10)
    with caplog.at_level(logging.WARNING, logger="ampft.data"):
        summary = run(_tiny("trainer.max_steps=2", f"cache_dir={cache}"), tmp_path / "run")
    assert summary["steps"] == 2 and (tmp_path / "run" / "model" / "model.safetensors").is_file()
    assert "could not write the tokenization cache" in caplog.text and "training from memory" in caplog.text
    assert "cache_dir=" in caplog.text
    assert not [p for p in cache.rglob("*") if p.is_dir() and ".tmp" in p.name]  # no half-written cache left


# -- nothing from a checkpoint runs code ---------------------------------------------------------------

class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(ckpt: Path, name: str, data: bytes) -> None:
    """Write a file into a checkpoint and record it in the manifest, as an attacker who controls the folder would."""
    (ckpt / name).write_bytes(data)
    body = manifest(ckpt)
    body["files"][name] = len(data)
    body["sha256"][name] = checkpointing.digests(ckpt, [name])[name]
    checkpointing.write_manifest(ckpt, body)  # resealed: the seal detects damage, not a deliberate rewrite
    assert not verify(ckpt)


@pytest.mark.parametrize("name", ["custom_checkpoint_0.pkl", "random_states_0.pkl", "optimizer.bin"])
def test_a_crafted_pickle_never_runs(saved, tmp_path, name):
    run_dir = _copy(saved, tmp_path)
    ckpt = run_dir / "checkpoints" / "step_4"
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    _plant(ckpt, name, pickle.dumps({"state": _Payload(marker)}))
    with pytest.raises(CheckpointError) as err:
        run(_tiny("trainer.max_steps=6", f"checkpoint.resume={ckpt}"), tmp_path / "other")
    assert not marker.exists()
    assert name in str(err.value) or "weights-only" in str(err.value)


def test_train_state_accepts_only_known_keys_of_their_types():
    good = TrainState().state_dict()
    TrainState().load_state_dict(json.loads(json.dumps(good)))
    for bad, needle in [({**good, "__class__": "os.system"}, "unknown key '__class__'"),
                        ({**good, "step": "7"}, "step='7' is not of type int"),
                        ({**good, "eval_results": {"accuracy": [1]}}, "eval_results"),
                        ({k: v for k, v in good.items() if k != "epoch"}, "missing key 'epoch'")]:
        with pytest.raises(CheckpointError, match=needle):
            TrainState().load_state_dict(bad)


# -- what "best" and "last good" mean ------------------------------------------------------------------

def test_checkpoint_metric_loss_is_minimised_unless_told_otherwise():
    cfg = compose_config("finetune", [*TINY, "checkpoint.metric=loss", "checkpoint.every=2", "checkpoint.keep_best=1"])
    validate(cfg)
    assert metric_mode(cfg.checkpoint.metric, cfg.checkpoint.mode) == "min"
    assert metric_mode("accuracy", None) == "max" and metric_mode("mnli_mm/loss", None) == "min"
    with pytest.raises(ConfigError, match=r"checkpoint.mode=max with checkpoint.metric=loss: loss is better when lower"):
        validate(compose_config("finetune", [*TINY, "checkpoint.metric=loss", "checkpoint.mode=max"]))


def _named_checkpoint(msg: str) -> Path:
    found = re.search(r"checkpoint.resume=(\S+) checkpoint.allow_config_change=true", msg)
    assert found, msg
    return Path(found.group(1))


def test_exploding_loss_stops_the_run_and_says_when_no_checkpoint_is_known_good(tmp_path):
    """optim.lr=1e3: the loss explodes within a few steps. step_2 was written before its weights' loss was
    seen (the checks run one update behind), and that loss exploded: no checkpoint is known good, and the
    message does not pretend one is; nothing is written after the exploded losses."""
    with pytest.raises(TrainingDiverged) as err:
        run(_tiny("optim.lr=1e3", "trainer.max_steps=20", "trainer.log_every=2"), tmp_path)
    msg = str(err.value)
    assert "the loss exploded" in msg and "precision.max_loss_ratio=10" in msg
    initial = json.loads((tmp_path / "checkpoints" / "step_2" / "train_state.json").read_text())["initial_loss"]
    for p in checkpoints(tmp_path):  # each judged by the loss its own weights produced
        health = manifest(p)["health"]
        assert health["ok"] == (health["loss"] < 10 * initial), (p, health)
    if not any(checkpointing.healthy(p) for p in checkpoints(tmp_path)):
        assert "No checkpoint of this run is known good to go back to" in msg
        assert "allow_config_change" not in msg  # no checkpoint to resume from is suggested
        assert resolve_resume(tmp_path, "latest") is None
    else:
        assert checkpointing.healthy(_named_checkpoint(msg))
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize("overrides", [
    # The first update with lr 5e29 wrecks the weights: the checkpoint of that step gives NaN losses.
    ["optim.lr=1e30", "scheduler.warmup_steps=2", "checkpoint.every=1"],
    # lr 1.0 after warmup: a checkpoint is saved from weights whose own loss (seen one update later) explodes.
    ["optim.lr=1.0", "scheduler.warmup_steps=8", "checkpoint.every=2"],
])
def test_divergence_never_names_a_checkpoint_whose_own_weights_diverged(tmp_path, overrides):
    """The loss of a step is computed with the previous update's weights: the check runs one update behind the
    save. The checkpoint named must be one whose own weights were checked: the loss they produced (logged at
    the next step, log_every=1) is finite and within max_loss_ratio, and so is its validation loss evaluated on
    its own. Newer checkpoints are marked diverged, `latest` skips them, and rotation (keep_last=1) keeps the
    good one."""
    with pytest.raises(TrainingDiverged) as err:
        run(_tiny("trainer.max_steps=20", "trainer.log_every=1", "checkpoint.keep_last=1", *overrides), tmp_path)
    msg = str(err.value)
    named = _named_checkpoint(msg)
    assert named.is_dir() and not verify(named)
    step = manifest(named)["step"]
    initial = json.loads((named / "train_state.json").read_text())["initial_loss"]
    losses = _losses(tmp_path)
    assert math.isfinite(losses[step + 1][0]) and losses[step + 1][0] <= 10 * initial, (step, losses)
    from ampft.evaluation.saved import evaluate_saved

    evaluated = evaluate_saved(OmegaConf.create(dict(run=None, checkpoint=str(named), split="validation", file=None,
                                                     precision=None, batch_size=None, name=None)))
    assert math.isfinite(evaluated["metrics"]["loss"]) and evaluated["metrics"]["loss"] <= 10 * initial
    newer = [p for p in checkpoints(tmp_path) if manifest(p)["step"] > step]
    assert newer and all(checkpointing.healthy(p) is False for p in newer)
    assert "is marked diverged, and checkpoint.resume=latest skips it" in msg
    assert resolve_resume(tmp_path, "latest") == named
    with pytest.raises(CheckpointError, match="its weights diverged"):
        resolve_resume(tmp_path, str(newer[-1]))


def test_the_divergence_advice_works_a_new_lr_and_warmup_take_effect_on_resume(tmp_path):
    """The message recommends resuming the named checkpoint with a lower optim.lr or more warmup and
    checkpoint.allow_config_change=true: the resumed run must train with them (loading the checkpoint had put
    back the old schedule). Its learning rates are transformers' schedule with the new base lr and warmup, step
    for step, and it trains to the end."""
    import torch
    from transformers import get_scheduler

    args = ["trainer.max_steps=20", "trainer.log_every=1", "checkpoint.every=2", "scheduler.warmup_steps=8"]
    with pytest.raises(TrainingDiverged) as err:
        run(_tiny(*args, "optim.lr=1.0"), tmp_path)
    named = _named_checkpoint(str(err.value))
    resumed_at = manifest(named)["step"]
    summary = run(_tiny(*args, "optim.lr=1e-3", "scheduler.warmup_steps=12", f"checkpoint.resume={named}",
                        "checkpoint.allow_config_change=true"), tmp_path)
    assert summary["steps"] == 20
    schedule = get_scheduler("linear", torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3),
                             num_warmup_steps=12, num_training_steps=20)
    expected = {}
    for step in range(1, 21):  # the lr an update used, logged at its step
        expected[step] = schedule.get_last_lr()[0]
        schedule.optimizer.step()
        schedule.step()
    logged = {e["step"]: e["lr"] for e in _entries(tmp_path) if e["event"] == "train"}
    assert sorted(logged) == list(range(1, 21))
    for step in range(resumed_at + 1, 21):
        assert logged[step] == pytest.approx(expected[step], rel=1e-12), step


def test_a_new_seed_cannot_take_effect_on_resume_and_is_refused(saved, tmp_path):
    run_dir = _copy(saved, tmp_path)
    with pytest.raises(CheckpointError, match=r"cannot take effect on a resume, not even with checkpoint.allow_config"
                                              r"_change=true:\n  - trainer.seed: 42 -> 7: a resume goes on with"):
        run(_tiny("trainer.max_steps=6", "trainer.seed=7", "checkpoint.resume=latest",
                  "checkpoint.allow_config_change=true"), run_dir)


def test_a_resume_from_another_run_dirs_checkpoint_writes_nothing_into_it(saved, tmp_path):
    """The health verdict on the checkpoint resumed from is recorded only in this run dir's checkpoints: another
    run's folder is not this run's to write."""
    ckpt = saved / "checkpoints" / "step_4"
    before = (ckpt / "manifest.json").read_bytes()
    summary = run(_tiny("trainer.max_steps=6", f"checkpoint.resume={ckpt}", "checkpoint.export=false"),
                  tmp_path / "other")
    assert summary["steps"] == 6 and (ckpt / "manifest.json").read_bytes() == before


def test_explosion_before_any_checkpoint_says_there_is_none(tmp_path):
    with pytest.raises(TrainingDiverged, match="No checkpoint of this run is known good to go back to"):
        run(_tiny("optim.lr=1e3", "trainer.max_steps=20", "trainer.log_every=2", "checkpoint.every=0"), tmp_path)

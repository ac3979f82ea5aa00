"""Distributed launches on CPU: two gloo ranks through `make finetune distributed=ddp nproc=2`, DeepSpeed
ZeRO-2/3 through `accelerate launch` (save, resume, consolidated export), and the generated launcher and
DeepSpeed configs checked against the precision group."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from ampft.distributed import deepspeed_config
from tests.conftest import CONF, ROOT, TINY

NO_DROPOUT = ["+model.arch.hidden_dropout_prob=0.0", "+model.arch.attention_probs_dropout_prob=0.0"]
DEEPSPEED = sorted(p.stem for p in (CONF / "distributed").glob("deepspeed-*.yaml"))


def _make(*args: str, timeout: int = 400) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "finetune", *args, f"PYTHON={sys.executable}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _train_losses(run_dir) -> dict[int, float]:
    events = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {e["step"]: e["loss"] for e in events if e["event"] == "train"}


@pytest.mark.parametrize("dist", DEEPSPEED)
@pytest.mark.parametrize("prec", ["fp32", "fp16", "bf16"])
def test_deepspeed_precision_section_comes_from_the_precision_group(compose, dist, prec):
    cfg = compose([f"distributed={dist}", f"precision={prec}", "trainer.batch_size=12", "trainer.grad_accum=3"])
    ds, _ = deepspeed_config(cfg)
    assert ds["fp16"]["enabled"] == (prec == "fp16") and ds["bf16"]["enabled"] == (prec == "bf16")
    if prec == "fp16":
        assert ds["fp16"]["initial_scale_power"] == 16 and ds["fp16"]["loss_scale_window"] == 2000
    zero = ds["zero_optimization"]
    assert zero["stage"] == cfg.distributed.zero_stage == int(dist.split("-z")[1][0])
    assert ("offload_optimizer" in zero) == dist.endswith("offload")
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (12, 3)
    if zero["stage"] == 3:
        assert zero["stage3_gather_16bit_weights_on_model_save"] is True


def test_launcher_configs_carry_no_precision_and_exist(compose):
    for path in (CONF / "accelerate").glob("*.yaml"):
        text = path.read_text()
        assert "mixed_precision" not in text and "deepspeed_config_file" not in text, path.name
        yaml.safe_load(text)
    for path in (CONF / "distributed").glob("*.yaml"):
        d = compose([f"distributed={path.stem}"]).distributed
        if d.accelerate_config:
            assert (CONF / "accelerate" / d.accelerate_config).is_file(), path.name


def test_dry_run_prints_the_command_for_every_machine():
    proc = _make("distributed=multinode", "nproc=4", "distributed.main_process_ip=10.1.2.3",
                 "hydra.run.dir=/shared/runs/j1", "precision=bf16", "dry_run=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "# machine 0" in out and "# machine 1" in out
    lines = [x for x in out.splitlines() if "accelerate.commands.launch" in x]
    assert len(lines) == 2
    for rank, line in enumerate(lines):
        assert f"--machine_rank {rank}" in line and "--num_processes 8" in line and "--num_machines 2" in line
        assert "--main_process_ip 10.1.2.3" in line and "hydra.run.dir=/shared/runs/j1" in line
        assert "precision=bf16" in line and "recipes/finetune.py" in line


def test_several_machines_need_a_shared_run_dir(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    proc = _make("distributed=multinode", "distributed.main_process_ip=10.1.2.3", "dry_run=1")
    assert proc.returncode != 0 and "hydra.run.dir" in proc.stderr


@pytest.mark.distributed
def test_two_cpu_ranks_match_one_process_with_the_same_global_batch(tmp_path):
    common = [*TINY, *NO_DROPOUT, "trainer.max_steps=12", "trainer.log_every=2", "trainer.eval_every=6"]
    one = _make(*common, "trainer.batch_size=32", f"hydra.run.dir={tmp_path / 'one'}")
    assert one.returncode == 0, one.stderr[-3000:]
    two = _make(*common, "distributed=ddp", "nproc=2", "trainer.batch_size=16", f"hydra.run.dir={tmp_path / 'two'}")
    assert two.returncode == 0, two.stderr[-3000:]

    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]  # one run dir for both ranks
    s1, s2 = (json.loads((tmp_path / n / "summary.json").read_text()) for n in ("one", "two"))
    assert (s2["num_processes"], s2["distributed_type"]) == (2, "MULTI_CPU")
    assert s1["eval_samples"] == s2["eval_samples"] == 101  # odd split, each example counted once
    assert s1["train_samples"] == s2["train_samples"] == 12 * 32
    # Same data per global step, same learning rates: the losses agree up to float summation order.
    l1, l2 = _train_losses(tmp_path / "one"), _train_losses(tmp_path / "two")
    assert l1.keys() == l2.keys()
    for step in l1:
        assert l2[step] == pytest.approx(l1[step], abs=1e-4), step
    assert s2["eval"]["accuracy"] == pytest.approx(s1["eval"]["accuracy"], abs=1 / 101)
    # Only rank 0 wrote: one line per logged step, not one per rank.
    lines = (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()
    assert len([x for x in lines if '"event": "train"' in x]) == len(l2) == 6


@pytest.mark.distributed
@pytest.mark.parametrize("stage", ["deepspeed-z2", "deepspeed-z3"])
def test_deepspeed_bf16_saves_resumes_and_exports(tmp_path, stage):
    from transformers import AutoModelForSequenceClassification

    common = [*TINY, f"distributed={stage}", "nproc=1", "precision=bf16", "checkpoint.every=4",
              "trainer.log_every=2", f"hydra.run.dir={tmp_path}"]
    first = _make(*common, "trainer.max_steps=4")
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "checkpoints" / "step_4" / "pytorch_model").is_dir()  # DeepSpeed's own layout
    resumed = _make(*common, "trainer.max_steps=8", "checkpoint.resume=latest")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["distributed_type"] == "DEEPSPEED" and summary["precision"] == "bf16"
    assert [s for s in _train_losses(tmp_path)] == [2, 4, 6, 8]
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "model")  # consolidated
    assert sum(p.numel() for p in model.parameters()) > 1_000_000


def test_deepspeed_with_several_cpu_ranks_is_refused_before_launch(tmp_path):
    run_dir = tmp_path / "run"
    proc = _make(*TINY, "distributed=deepspeed-z2", "nproc=2", "trainer.max_steps=2", f"hydra.run.dir={run_dir}")
    assert proc.returncode != 0
    assert "DeepSpeed can only run with nproc=1" in proc.stderr
    assert not run_dir.exists()  # refused by the launcher: no rank started


@pytest.mark.distributed
def test_deepspeed_world_mismatch_is_refused_in_the_ranks_too(tmp_path):
    """Typed by hand, past the launcher's check: the ranks themselves refuse instead of training twice."""
    proc = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "conf/accelerate/deepspeed.yaml",
         "--num_processes", "2", "--num_machines", "1", "recipes/finetune.py", *TINY, "distributed=deepspeed-z2",
         "trainer.max_steps=2", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode != 0
    assert "DeepSpeed can only run with nproc=1" in proc.stderr
    assert not (tmp_path / "summary.json").exists()

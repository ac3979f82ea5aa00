"""`make estimate` end to end: the recipe composes any finetune overrides, writes estimate.json/.md, refuses bad keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ampft.config import schema_fields
from ampft.errors import ConfigError
from ampft.estimate.config import check
from tests.helpers import ROOT, compose_config


def _run(tmp_path, *overrides):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, str(ROOT / "recipes" / "estimate.py"), f"hydra.run.dir={tmp_path}",
                           *overrides], capture_output=True, text=True, env=env, cwd=ROOT)


def test_estimate_writes_every_precision_side_by_side(tmp_path):
    r = _run(tmp_path, "model=tiny-bert", "precision=bf16", "trainer.batch_size=8", "task.max_length=64",
             "estimate.gpu=l4", "distributed=fsdp", "distributed.num_processes=4")
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((tmp_path / "estimate.json").read_text())
    assert result["precisions"] == ["fp32", "tf32", "fp16", "bf16"] and result["precision"] == "bf16"
    assert result["strategy"] == "fsdp2" and result["ranks"] == 4
    row = result["rows"]["bf16"]
    assert set(row["memory"]) == {"single", "ddp", "zero1", "zero2", "zero3", "fsdp2"}
    single = row["memory"]["single"]
    assert single["fits"] and single["largest_batch"] > 8
    # The L4's 24 GB less the assumed CUDA context (0.5 GiB) and workspaces (32 MiB), over the allocator's 5% slack.
    fixed = 0.5 * 2**30 + 32 * 2**20
    assert result["usable_bytes"] == pytest.approx((24e9 - fixed) / 1.05)
    assert single["device_total"] == pytest.approx(single["peak"] * 1.05 + fixed)
    assert row["time"]["seconds"] > 0 and result["verdicts"]
    md = (tmp_path / "estimate.md").read_text()
    assert "**Predictions**" in md and "FSDP2 (recipe)" in md and "NVIDIA L4" in md
    assert "PREDICTED" in r.stdout and "bf16 (asked)" in r.stdout
    # The terminal shows the recipe's strategy: FSDP2's per-rank peak, not one device's.
    fsdp = result["rows"]["bf16"]["memory"]["fsdp2"]
    assert "per rank, FSDP2 on 4 ranks -- PREDICTED" in r.stdout
    assert f"| bf16 (asked) | {fsdp['peak'] / 2**30:.2f} |" in r.stdout and fsdp["peak"] < single["peak"]


def test_a_precision_the_gpu_lacks_gets_memory_but_no_time(tmp_path):
    r = _run(tmp_path, "model=tiny-bert", "trainer.batch_size=4", "task.max_length=32", "estimate.gpu=v100-32gb",
             "estimate.precisions=[fp32,bf16]", "trainer.grad_accum=2")
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((tmp_path / "estimate.json").read_text())
    assert result["rows"]["bf16"]["time"] is None and result["rows"]["bf16"]["memory"]["single"]["peak"] > 0
    md = (tmp_path / "estimate.md").read_text()
    assert "not supported" in md
    assert "trainer.grad_accum=2: step ms is one micro-batch of 4 and an optimizer step" in md  # what it times


def test_bad_values_are_refused_with_the_key_and_the_choices(tmp_path):
    r = _run(tmp_path, "model=tiny-bert", "estimate.gpu=a100")
    assert r.returncode == 2 and "estimate.gpu=a100" in r.stderr and "a100-80gb" in r.stderr
    r = _run(tmp_path, "model=tiny-bert", "estimate.gpus=a100-80gb")
    assert r.returncode != 0 and "gpus" in r.stderr
    with pytest.raises(ConfigError) as err:
        check(compose_config("estimate", ["estimate.ranks=0", "estimate.efficiency=2", "estimate.allocator_overhead=-1"]).estimate)
    assert len(err.value.problems) == 3


def test_the_finetune_schema_is_unchanged():
    """The estimate keys live in their own schema, not in the finetune one."""
    assert not any(k.startswith("estimate") for k in schema_fields())


@pytest.mark.parametrize("task", ["demo", "stsb", "conll2003", "squad"])
def test_every_task_family_traces_with_its_own_head_and_targets(task):
    """The family gives the labels and the training targets (`Family.typical_label_count`, `fake_targets`), so a
    new family needs nothing in ampft.estimate: each of the four traces a step whose loss has a gradient."""
    from ampft.estimate.run import trace_all

    cfg = compose_config("estimate", ["model=tiny-bert", f"task={task}", "trainer.batch_size=4", "task.max_length=32"])
    step = trace_all(cfg, ["fp32"], "cpu")[0]["fp32"]
    # backward ran from the head's loss: an fp32 gradient for every trainable parameter
    assert step.gradients == 4 * step.trainable_params and step.saved_activations > 0 and step.flops > 0


@pytest.mark.parametrize("task", ["demo", "stsb"])
def test_deberta_sequence_classification_traces(task):
    """DeBERTa-v2's classification loss picks its labelled rows with nonzero() unless the config names the problem:
    a shape no fake tensor has, so `make estimate model=deberta-v3-base` crashed with a traceback."""
    from ampft.estimate.run import trace_all

    small = ["model.arch.hidden_size=64", "model.arch.num_hidden_layers=2", "model.arch.num_attention_heads=4",
             "model.arch.intermediate_size=128"]
    cfg = compose_config("estimate", ["model=deberta-v3-base", *small, f"task={task}", "trainer.batch_size=4",
                                      "task.max_length=32"])
    step = trace_all(cfg, ["fp32"], "cuda")[0]["fp32"]
    assert step.gradients == 4 * step.trainable_params and step.flops > 0


def test_a_pretrained_model_is_counted_with_its_checkpoints_vocabulary():
    """The trace builds the architecture with random weights; a pretrained run has the checkpoint's vocabulary
    (model.arch.vocab_size), not the offline tokenizer's 30522: DeBERTa-v3-base was counted at 109M parameters of 184M."""
    from ampft.estimate.run import trace_all

    small = ["model.arch.hidden_size=64", "model.arch.num_hidden_layers=1", "model.arch.num_attention_heads=4",
             "model.arch.intermediate_size=128", "trainer.batch_size=2", "task.max_length=16"]
    params = {}
    for pretrained in (True, False):
        cfg = compose_config("estimate", ["model=deberta-v3-base", *small, f"model.pretrained={pretrained}"])
        params[pretrained] = trace_all(cfg, ["fp32"], "cuda")[0]["fp32"].params
    assert params[True] - params[False] == (128_100 - 30_522) * 64

"""The distributed group's pieces that need no second process: the FSDP layer class per model, the DeepSpeed
JIT folder, finiteness checks on sharded weights, the world taken from the launcher's environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForSequenceClassification, BertConfig, DistilBertConfig, RobertaConfig

from ampft import distributed
from ampft.engine import weights_finite

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100)


@pytest.mark.parametrize("config, layer", [
    (BertConfig(**SMALL), "BertLayer"),
    (RobertaConfig(**SMALL), "RobertaLayer"),
    (DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=64, vocab_size=100), "TransformerBlock"),
])
def test_fsdp_wraps_the_transformer_layer_not_the_embeddings(config, layer):
    model = AutoModelForSequenceClassification.from_config(config)
    assert distributed.transformer_layer_class(model) == layer
    if layer == "BertLayer":  # what Accelerate would wrap otherwise: the embeddings too, sharded twice
        assert "BertEmbeddings" in model._no_split_modules


def test_deepspeed_jit_extensions_get_a_folder_per_run(compose, tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    distributed.prepare_environment(compose(["distributed=ddp"]), tmp_path)
    assert "TORCH_EXTENSIONS_DIR" not in os.environ
    distributed.prepare_environment(compose(["distributed=deepspeed-z2"]), tmp_path)
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path.resolve() / "torch_extensions")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/opt/shared-builds")  # the user's choice wins
    distributed.prepare_environment(compose(["distributed=deepspeed-z2"]), tmp_path / "other")
    assert os.environ["TORCH_EXTENSIONS_DIR"] == "/opt/shared-builds"


def test_weights_finite_checks_the_local_shard_of_released_zero3_parameters():
    model = torch.nn.Linear(4, 4)
    assert weights_finite(model)
    for p in model.parameters():  # what ZeRO-3 leaves: an empty placeholder and this rank's partition
        p.data = torch.empty(0)
        p.ds_tensor = torch.tensor([1.0, float("nan")])
    assert not weights_finite(model)
    for p in model.parameters():
        p.ds_tensor = torch.ones(2)
    assert weights_finite(model)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU world")
def test_a_launcher_world_on_cpu_trains_as_gloo_ranks_whatever_distributed_says(compose, monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert distributed.cpu_world(compose([]))  # distributed=single under `accelerate launch --num_processes 2`
    assert distributed.cpu_world(compose(["distributed=fsdp"]))
    assert not distributed.cpu_world(compose(["distributed=deepspeed-z2"]))  # DeepSpeed: gloo by its kwargs
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # `accelerate launch --use_deepspeed`
    assert not distributed.cpu_world(compose([]))
    assert "kwargs_handlers" in distributed.accelerator_kwargs(compose([]))
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    assert not distributed.cpu_world(compose([]))


def test_fsdp_bf16_keeps_fp32_weights_and_reductions_like_autocast(compose):
    """Accelerate's default FSDP2 policy for bf16 would cast the weights (LayerNorm included) and reduce
    gradients in bf16; ampft's keeps autocast semantics, as on every other backend."""
    plugin = distributed.accelerator_kwargs(compose(["distributed=fsdp", "precision=bf16"]))["fsdp_plugin"]
    plugin.set_mixed_precision("bf16")  # what AcceleratorState does with mixed_precision="bf16"
    policy = plugin.mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (None, None, None)


@pytest.mark.parametrize("module", ["ampft.finetune", "ampft.evaluation.saved"])
def test_a_recipes_process_ends_its_process_group_before_the_interpreter_finalizes(module, tmp_path):
    """A gloo rank exiting with its group alive can abort in the group's teardown (SIGABRT, "terminate called
    without an active exception"): the finetune recipe and the eval and predict recipes (which open the run
    through ampft.evaluation.saved) each end it at exit."""
    code = ("import atexit, torch.distributed as d\n"
            "atexit.register(lambda: print('alive' if d.is_initialized() else 'ended'))  # runs last: LIFO\n"
            f"import {module}\n"
            f"d.init_process_group('gloo', init_method='file://{tmp_path / 'store'}', rank=0, world_size=1)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "ended"

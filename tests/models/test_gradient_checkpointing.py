"""model.gradient_checkpointing: the same training step for step (dropout masks replayed), less activation memory,
one more forward of the layers per step; the one switch on every backend."""

from __future__ import annotations

import json

import pytest
import torch
import transformers.modeling_utils

from ampft import distributed
from ampft.checkpointing import breaking_changes
from ampft.config import ConfigError
from ampft.estimate.trace import trace_step
from ampft.finetune import build_optimizer, run
from ampft.models import build_model, load_tokenizer
from ampft.tasks import family_for
from ampft.validation import validate

NO_DROPOUT = ["+model.arch.hidden_dropout_prob=0.0", "+model.arch.attention_probs_dropout_prob=0.0"]


def _losses(run_dir) -> dict[int, float]:
    events = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {e["step"]: e["loss"] for e in events if e["event"] == "train"}


@pytest.fixture
def checkpoint_calls(monkeypatch) -> list[dict]:
    """Every call of torch's checkpoint that transformers makes (the function it binds when checkpointing is
    enabled), with its keyword arguments."""
    calls: list[dict] = []
    real = transformers.modeling_utils.checkpoint

    def counted(function, *args, **kwargs):
        calls.append(kwargs)
        return real(function, *args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "checkpoint", counted)
    return calls


@pytest.mark.parametrize("precision,dropout", [
    ("fp32", "on"),
    pytest.param("fp32", "off", marks=pytest.mark.slow),
    pytest.param("bf16", "on", marks=pytest.mark.slow),
    pytest.param("fp16", "on", marks=pytest.mark.slow),
])
def test_a_checkpointed_run_gives_exactly_the_losses_of_one_without(tiny, tmp_path, checkpoint_calls, precision,
                                                                     dropout):
    """tiny-bert's dropout (0.1) on: the recomputed forward must draw the same masks, or the losses part at once."""
    args = ["trainer.max_steps=8", "trainer.log_every=1", f"precision={precision}",
            *(NO_DROPOUT if dropout == "off" else [])]
    without = run(tiny(*args), tmp_path / "without")
    assert not checkpoint_calls
    with_ = run(tiny(*args, "model.gradient_checkpointing=true"), tmp_path / "with")
    # Every layer of every forward in training went through torch's non-reentrant checkpoint (2 layers, at least
    # one chunk per micro-batch); evaluation (no gradients) recomputes nothing and is not checkpointed.
    assert len(checkpoint_calls) >= 2 * 8 and all(c == {"use_reentrant": False} for c in checkpoint_calls)
    assert (without["gradient_checkpointing"], with_["gradient_checkpointing"]) == (False, True)
    assert _losses(tmp_path / "with") == _losses(tmp_path / "without")
    assert with_["eval"] == without["eval"]
    # Nothing of the switch leaks into the export: it reloads as any other (use_cache is the one config change).
    config = json.loads((tmp_path / "with" / "model" / "config.json").read_text())
    assert not any("checkpointing" in k for k in config)


@pytest.mark.slow
def test_compiled_and_checkpointed_trains_as_compiled(tiny, tmp_path):
    """Under trainer.compile the checkpointed layers compile into the graph (dynamo's checkpoint operator); the
    partitioned graphs round differently, so the losses agree to float32 rounding rather than bit for bit."""
    args = ["trainer.max_steps=6", "trainer.log_every=1", "trainer.compile=true"]
    run(tiny(*args), tmp_path / "without")
    summary = run(tiny(*args, "model.gradient_checkpointing=true"), tmp_path / "with")
    assert summary["compiled"] and summary["gradient_checkpointing"]
    ref, got = _losses(tmp_path / "without"), _losses(tmp_path / "with")
    assert sorted(got) == sorted(ref) == list(range(1, 7))
    for step, loss in got.items():
        assert loss == pytest.approx(ref[step], abs=1e-5), step


def _traced_step(compose, checkpointing: bool, batch: int = 16, length: int = 128):
    """One real training step of tiny-bert (real tensors on this CPU), every storage it creates counted while
    alive (`ampft.estimate.trace`)."""
    cfg = compose(["model=tiny-bert", f"model.gradient_checkpointing={str(checkpointing).lower()}"])
    family = family_for(cfg.task.family)
    torch.manual_seed(0)
    model = build_model(cfg.model, load_tokenizer(cfg.model), ["negative", "positive"], family)
    shape = (batch, length)
    data = dict(input_ids=torch.randint(1000, model.config.vocab_size, shape),
                attention_mask=torch.ones(shape, dtype=torch.long), token_type_ids=torch.zeros(shape, dtype=torch.long),
                labels=torch.zeros(batch, dtype=torch.long))
    return trace_step(model, data, "fp32", "cpu", lambda m: build_optimizer(m, cfg.optim, torch.device("cpu")))


def test_activation_memory_falls_and_the_step_recomputes_a_forward(compose):
    """Measured in this process on real tensors: the forward/backward peak of everything alive, and the FLOPs of
    every op that ran."""
    without, with_ = _traced_step(compose, False), _traced_step(compose, True)
    assert (without.checkpointed_layers, with_.checkpointed_layers) == (0, 2)
    # Saved for backward: each layer's input instead of every intermediate (attention probabilities, GELU input...).
    assert with_.saved_activations < 0.25 * without.saved_activations
    assert with_.forward_backward.peak < 0.7 * without.forward_backward.peak
    # The backward pass runs each layer's forward again: a forward is about a third of forward + backward.
    assert 1.2 < with_.forward_backward.flops / without.forward_backward.flops < 1.4
    assert (with_.weights, with_.gradients, with_.optimizer_state) == (without.weights, without.gradients,
                                                                       without.optimizer_state)


def test_fsdp_checkpoints_through_the_model_switch_only(compose, monkeypatch):
    """FSDP's own activation checkpointing (Accelerate's checkpoint_wrapper around each layer) stays off, so nothing
    is checkpointed twice; a launcher that asks for it is refused up front with the switch that works."""
    cfg = compose(["distributed=fsdp", "model.gradient_checkpointing=true"])
    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING", "true")
    assert distributed.accelerator_kwargs(cfg)["fsdp_plugin"].activation_checkpointing is False
    with pytest.raises(ConfigError, match="model.gradient_checkpointing=true"):
        validate(cfg)
    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING", "false")
    validate(cfg)
    # ampft's DeepSpeed config has no activation_checkpointing section (it acts only on deepspeed.checkpointing).
    ds = distributed.deepspeed_config(compose(["distributed=deepspeed-z3", "model.gradient_checkpointing=true"]))[0]
    assert "activation_checkpointing" not in ds


def test_switching_it_on_resume_is_exact_in_eager_mode_only(compose):
    saved = {"model": {"gradient_checkpointing": False}, "trainer": {"compile": False}}
    on = {"model": {"gradient_checkpointing": True}, "trainer": {"compile": False}}
    assert breaking_changes(saved, on) == []
    assert breaking_changes({"model": {}, "trainer": {"compile": False}}, saved) == []  # a checkpoint from before
    compiled = {"model": {"gradient_checkpointing": True}, "trainer": {"compile": True}}
    saved["trainer"]["compile"] = True
    assert breaking_changes(saved, compiled) == ["model.gradient_checkpointing: False -> True"]


def test_resumed_with_checkpointing_switched_on_continues_exactly(tiny, tmp_path):
    """A run that ran out of memory resumes from its checkpoint with model.gradient_checkpointing=true: the steps
    after the checkpoint are those of the run without it, dropout on."""
    args = ["trainer.max_steps=8", "trainer.log_every=1", "checkpoint.every=4", "checkpoint.keep_last=2"]
    run(tiny(*args), tmp_path)
    reference = _losses(tmp_path)
    summary = run(tiny(*args, "model.gradient_checkpointing=true",
                       f"checkpoint.resume={tmp_path / 'checkpoints' / 'step_4'}"), tmp_path)
    assert summary["gradient_checkpointing"] and summary["steps"] == 8
    assert _losses(tmp_path) == reference


@pytest.mark.parametrize("arch", [["model=distilbert", "model.arch.dim=64", "model.arch.n_layers=2", "model.arch.n_heads=4",
                                   "model.arch.hidden_dim=128"],
                                  ["model=deberta-v3-base", "model.arch.hidden_size=64", "model.arch.num_hidden_layers=2",
                                   "model.arch.num_attention_heads=4", "model.arch.intermediate_size=128"]])
def test_models_whose_config_has_no_is_decoder_build_checkpointed(compose, arch):
    """DistilBERT's and DeBERTa-v2's configs have no `is_decoder` (transformers 5): building them with checkpointing
    (finetune, benchmark, estimate) raised AttributeError."""
    cfg = compose([*arch, "model.pretrained=false", "model.gradient_checkpointing=true"])
    model = build_model(cfg.model, load_tokenizer(cfg.model), ["negative", "positive"], family_for(cfg.task.family))
    assert model.is_gradient_checkpointing and model.config.use_cache is False

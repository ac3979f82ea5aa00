"""The task family registry: one object per family, found by task.family; a new family is one registered object
(no edit elsewhere in the package). What each family does is tested where it runs (tests/tasks/test_families.py,
tests/finetune/test_model_card.py: its model class, pipeline tag and usage, per family)."""

from __future__ import annotations

import contextlib

import pytest

from ampft.config import ConfigError
from ampft.data import prepare_data
from ampft.models import build_model, load_tokenizer
from ampft.tasks import FAMILIES, check_installed, family_for, register
from ampft.tasks.classification import Classification
from ampft.validation import metric_keys, validate
from tests.helpers import compose_config


def test_a_token_classification_model_needs_its_labels():
    """A NER head has one output per tag: without the tag set there is no model to build."""
    with pytest.raises(ValueError, match="needs its labels"):
        FAMILIES["token_classification"].model_kwargs(None)


def test_unknown_family_is_a_config_error_naming_the_registered_ones():
    with pytest.raises(KeyError, match=r"task.family=nope: not a task family; registered are \['classification'"):
        family_for("nope")
    with pytest.raises(ConfigError, match=r"task.family=nope: not a task family; use one of \['classification', "
                                          r"'question_answering', 'regression', 'token_classification'\]"):
        validate(compose_config("finetune", ["task.family=nope"]))


def test_register_refuses_a_second_family_of_a_name():
    with pytest.raises(ValueError, match="'classification' is registered twice"):
        register(Classification())
    assert type(FAMILIES["classification"]) is Classification


def test_check_installed_passes_metrics_that_need_no_extra():
    check_installed(["accuracy", "seqeval", "squad"])


class Sentiment(Classification):
    """A family added from outside the package: a name, its own metric table and a check of its own."""

    name = "sentiment"
    metrics = {"accuracy": ("accuracy",), "polarity": ("accuracy",)}

    def check(self, task, files):
        problems = super().check(task, files)
        if len(task.text_fields) != 1:
            problems.append(f"task.text_fields={list(task.text_fields)}: task.family=sentiment reads one sentence")
        return problems


def test_a_new_family_is_one_registered_object(tmp_path):
    """Registering a family is all it takes for the config check, the data pipeline and the model to use it."""
    family = register(Sentiment())
    try:
        assert family_for("sentiment") is family
        overrides = ["model=tiny-bert", "task=demo", "task.family=sentiment", "task.metrics=[polarity]",
                     "task.main_metric=accuracy", "task.max_train_samples=16", "task.max_eval_samples=8",
                     f"cache_dir={tmp_path}"]
        cfg = compose_config("finetune", overrides)
        validate(cfg)
        assert metric_keys(cfg.task) == ["accuracy"]
        with pytest.raises(ConfigError, match="task.family=sentiment reads one sentence"):
            validate(compose_config("finetune", [*overrides, "task.text_fields=[a,b]"]))
        with pytest.raises(ConfigError, match=r"\['pearson'\], which task.family=sentiment does not compute"):
            validate(compose_config("finetune", [*overrides, "task.metrics=[pearson]", "task.main_metric=pearson"]))

        tokenizer = load_tokenizer(cfg.model)
        data = prepare_data(cfg, family, tokenizer, contextlib.nullcontext)
        assert data.family is family and data.labels == ["negative", "positive"] and len(data.train) == 16
        model = build_model(cfg.model, tokenizer, data.labels, family)
        assert type(model).__name__.endswith("ForSequenceClassification") and model.config.num_labels == 2
    finally:
        del FAMILIES["sentiment"]

"""Every config file composes against the schema; typos and bad values fail at compose time."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from ampft.config import ConfigError
from ampft.validation import validate
from tests.helpers import CONF, compose_config

# The finetune recipe's groups; conf/evaluate, conf/predict and conf/benchmark belong to the other
# recipes, conf/accelerate to `accelerate launch`.
OTHER_RECIPES = ("evaluate", "predict", "benchmark", "accelerate")  # accelerate: launcher files
GROUP_FILES = sorted(p for p in CONF.rglob("*.yaml")
                     if p.parent != CONF and p.relative_to(CONF).parts[0] not in OTHER_RECIPES)


NEEDS_USER_INPUT = {"task=csv": "task.train_file", "distributed=multinode": "main_process_ip"}


def _override(path) -> str:
    """group=option; a file in a folder inside a group is an option named by its path (experiment=bert-paper/glue)."""
    group, *option = path.relative_to(CONF).with_suffix("").parts
    return f"{group}={'/'.join(option)}"


def test_every_config_file_is_covered():
    # Recursive: a file in a nested folder must be reached too, not only conf/*.yaml.
    assert {p.parent.name for p in GROUP_FILES} >= {
        "model", "task", "precision", "distributed", "optim", "scheduler", "trainer", "checkpoint",
        "logging", "experiment",
    }


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: _override(p))
def test_each_config_file_composes_and_validates(compose, path):
    cfg = compose([_override(path)])
    group = path.relative_to(CONF).parts[0]
    if group in ("model", "task", "precision"):
        assert cfg[group].name == path.stem
    needs = NEEDS_USER_INPUT.get(f"{group}={path.stem}")
    if needs:  # options that need the user's own values say which key to set
        with pytest.raises(ConfigError, match=needs):
            validate(cfg)
    else:
        validate(cfg)


def test_default_is_the_offline_recipe(compose):
    cfg = compose()
    assert (cfg.model.name, cfg.task.name, cfg.precision.name) == ("minilm-l6", "demo", "fp32")
    assert cfg.model.name_or_path.startswith("pkg://")


def test_unknown_key_is_rejected(compose):
    with pytest.raises(ConfigCompositionException) as err:
        compose(["trainer.max_step=20"])
    assert "max_step" in str(err.value.__cause__ or err.value)


def test_bad_enum_value_lists_the_choices(compose):
    with pytest.raises(ConfigCompositionException) as err:
        compose(["precision.name=fp8"])
    msg = str(err.value.__cause__ or err.value)
    assert "fp8" in msg and "fp32, tf32, fp16, bf16" in msg


def test_unknown_group_option_lists_the_choices(compose):
    with pytest.raises(ConfigCompositionException, match=r"(?s)precision.*bf16.*fp16.*fp32.*tf32"):
        compose(["precision=fp99"])


def test_type_errors_fail_at_compose(compose):
    with pytest.raises(ConfigCompositionException) as err:
        compose(["trainer.batch_size=big"])
    assert isinstance(err.value.__cause__, ValidationError | ConfigKeyError)


def test_all_cross_field_problems_reported_at_once(compose, tmp_path):
    cfg = compose([
        "task=csv",
        f"task.train_file={tmp_path}/missing.csv",
        "task.validation_file=dev.xlsx",
        "task.metrics=[accuracy,bleu]",
        "trainer.grad_accum=0",
        "optim.lr=0",
        "checkpoint.resume=/nonexistent/step_3",
    ])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    problems = err.value.problems
    text = "\n".join(problems)
    for needle in ("missing.csv: no such file", ".xlsx", "bleu", "trainer.grad_accum=0", "optim.lr=0",
                   "checkpoint.resume=/nonexistent/step_3"):
        assert needle in text, f"{needle!r} not reported in:\n{text}"
    assert len(problems) >= 6


@pytest.mark.parametrize("override", [
    "checkpoint.every=-1", "checkpoint.keep_last=0", "checkpoint.keep_best=-1", "distributed.num_processes=0",
    "distributed.num_machines=0", "distributed.zero_stage=4", "precision.init_scale=0", "precision.growth_factor=1",
    "precision.backoff_factor=1", "precision.growth_interval=0", "precision.max_consecutive_nonfinite=0",
    "precision.max_loss_ratio=0.5", "trainer.max_steps=-5",
])
def test_a_value_outside_its_schema_range_names_the_key_and_the_range(compose, override):
    """Each key's range is declared once, with the key (`setting(range=...)`), whatever the precision or backend."""
    with pytest.raises(ConfigError) as err:
        validate(compose([override]))
    key = override.split("=")[0]
    assert [p for p in err.value.problems if p.startswith(f"{key}=") and ": must be " in p], err.value.problems


def test_random_init_needs_an_architecture(compose):
    cfg = compose(["model=bert-large", "model.pretrained=false", "~model.arch.model_type"])
    with pytest.raises(ConfigError, match="model.arch.model_type"):
        validate(cfg)


def test_experiment_overrides_groups(compose):
    cfg = compose(["experiment=sst2-bert-base", "precision=bf16"])
    assert (cfg.model.name, cfg.task.name, cfg.precision.name) == ("bert-base", "sst2", "bf16")
    assert cfg.optim.lr == pytest.approx(2e-5)


def test_default_run_dir_names_task_model_and_precision():
    cfg = compose_config("finetune", ["model=tiny-bert", "precision=bf16"], return_hydra_config=True)
    run_dir = str(cfg.hydra.run.dir)
    assert run_dir.startswith("runs/demo/tiny-bert-bf16/20"), run_dir  # not "Precision.bf16"


# What Hydra composes without a word although nothing reads it, and what it cannot compose: the recipes'
# compose (ampft.launch.compose; recipes/*.py through ampft.errors, tests/e2e/test_exit_codes.py) makes both a
# ConfigError of one line naming the key and what would work.

@pytest.mark.parametrize(("override", "named", "suggested"), [
    ("+trainer.max_step=3", "trainer.max_step", "did you mean trainer.max_steps"),
    ("+precison=bf16", "precison", "did you mean precision?"),
    ("+trainer.foo=1", "trainer.foo", "the keys of trainer: trainer.epochs, trainer.max_steps"),
    ("+trainer.foo.bar=1", "trainer.foo", "the keys of trainer:"),
    ("++trainer.max_stpes=3", "trainer.max_stpes", "did you mean trainer.max_steps"),
    ("experiment=sst2-bert-bsae", "experiment=sst2-bert-bsae", "choose one of bert-paper/conll2003"),
    ("experiment=bert-paper/nope", "experiment=bert-paper/nope", "choose one of bert-paper/conll2003, bert-paper/glue"),
    ("experiment=nope", "experiment=nope", "bert-paper/squad, cola-bert-base"),
])
def test_a_key_or_option_nothing_reads_is_refused(override, named, suggested):
    from ampft.launch import compose as recipe_compose

    with pytest.raises(ConfigError) as err:
        recipe_compose(["model=tiny-bert", override])
    assert err.value.problems == [err.value.problems[0]] and "\n" not in str(err.value)
    problem = err.value.problems[0]
    assert problem.startswith(override + ":") and named in problem and suggested in problem


def test_keys_the_schema_leaves_open_and_groups_still_compose():
    from ampft.launch import compose as recipe_compose

    cfg = recipe_compose(["model=tiny-bert", "+model.arch.hidden_dropout_prob=0.0", "++model.arch.foo.bar=1",
                          "++trainer.max_steps=3", "experiment=sst2-bert-base",
                          "~model.arch.model_type", "hydra.job.name=x"])
    assert cfg.model.arch.hidden_dropout_prob == 0.0 and cfg.model.arch.foo.bar == 1
    assert cfg.trainer.max_steps == 3 and cfg.task.name == "sst2" and "model_type" not in cfg.model.arch


@pytest.mark.parametrize(("override", "expected"), [
    ("trainer.max_step=20", "trainer.max_step: no such key; did you mean trainer.max_steps or trainer.max_minutes?"),
    ("precison=bf16", "precison: no such key; did you mean precision?"),
    ("precision=fp8", "precision=fp8: no such option in conf/precision/; choose one of bf16, fp16, fp32, tf32"),
    ("trainer.max_steps=abc", "trainer.max_steps: Value 'abc' of type 'str' could not be converted to Integer"),
    ("precision.name=fp8", "precision.name: Invalid value 'fp8', expected one of [fp32, tf32, fp16, bf16]"),
    ("trainer.max_steps=[", "trainer.max_steps=[: not an override Hydra can parse"),
    ("~trainer.foo", "Could not delete from config. 'trainer.foo' does not exist."),
])
def test_what_hydra_cannot_compose_is_one_line_naming_the_key_and_the_choices(override, expected):
    from ampft.launch import compose as recipe_compose

    with pytest.raises(ConfigError) as err:
        recipe_compose(["model=tiny-bert", override])
    assert str(err.value) == f"1 problem(s) in the config: {expected}" or (
        str(err.value).startswith(f"1 problem(s) in the config: {expected}") and "\n" not in str(err.value))

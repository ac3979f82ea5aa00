"""One source of defaults: the schema's dataclasses (ampft.config). A config group's files, task and model files
included, hold only what differs from them, so a default cannot be written twice and drift (trainer.log_every was
50 in the schema and 20 in conf/trainer/default.yaml; 48 task-file keys restated max_length 128, metrics [accuracy],
doc_stride, n_best, ...)."""

from __future__ import annotations

import pytest
from omegaconf import MISSING, OmegaConf

from ampft.config import FinetuneConfig
from tests.helpers import CONF, compose_config

SCHEMA = OmegaConf.to_container(OmegaConf.structured(FinetuneConfig), enum_to_str=True)
# Every schema group that has a folder of options in conf/.
GROUPS = tuple(g for g, v in SCHEMA.items() if isinstance(v, dict) and (CONF / g).is_dir())
# The groups whose schema has a default for every key (task and model files must name theirs).
SETTINGS = tuple(g for g in GROUPS if MISSING not in SCHEMA[g].values())
# Keys that name what an option is, stated even where they equal the default (deepspeed-z2 is ZeRO stage 2
# whatever the schema's default stage; `name` names every option).
IDENTITY = {"name", "backend", "zero_stage"}


def _files(group):
    return sorted((CONF / group).glob("*.yaml"))


def repeated_defaults(group: str, values: dict) -> dict:
    """The keys of a group file's `values` that equal the schema's default (identity keys aside)."""
    defaults = SCHEMA[group]
    return {k: v for k, v in values.items() if k not in IDENTITY and k in defaults and v == defaults[k]}


def test_every_group_with_options_is_checked():
    assert {"task", "model", "precision", "distributed", "optim", "scheduler", "trainer", "checkpoint",
            "logging"} <= set(GROUPS)
    assert {"task", "model"}.isdisjoint(SETTINGS) and "trainer" in SETTINGS


@pytest.mark.parametrize("path", [p for g in GROUPS for p in _files(g)], ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_group_file_holds_only_differences_from_the_schema(path):
    group = path.parent.name
    values = OmegaConf.to_container(OmegaConf.load(path), enum_to_str=True)
    unknown = sorted(set(values) - set(SCHEMA[group]))
    assert not unknown, f"{path}: keys {unknown} are not in the schema"
    repeated = repeated_defaults(group, values)
    assert not repeated, (f"{path} repeats the schema's defaults {repeated}: delete them (ampft.config holds "
                          "the defaults; a group file only what differs)")


def test_a_repeated_default_is_found_in_a_task_and_a_model_file(tmp_path):
    """The check above fails on a file that restates a default, a differing value passes."""
    task = tmp_path / "task.yaml"
    task.write_text("name: mine\ndataset: me/mine\nmax_length: 128\nmetrics: [accuracy]\ndoc_stride: 64\n")
    assert repeated_defaults("task", OmegaConf.to_container(OmegaConf.load(task))) == {
        "max_length": 128, "metrics": ["accuracy"]}
    assert repeated_defaults("model", {"name": "m", "name_or_path": "m", "attn_implementation": "auto",
                                       "arch": {}}) == {"attn_implementation": "auto", "arch": {}}


@pytest.mark.parametrize("group", ["task", "model"])
def test_every_task_and_model_file_sets_the_keys_without_a_default(group):
    """name (and model.name_or_path) have no default: a file without them would fail only when composed."""
    required = {k for k, v in SCHEMA[group].items() if v == MISSING}
    assert required == ({"name"} if group == "task" else {"name", "name_or_path"})
    for path in _files(group):
        values = OmegaConf.load(path)
        assert required <= set(values), f"{path}: sets none of {sorted(required - set(values))}"
        assert values.name == path.stem, f"{path}: name={values.name}, the option is {path.stem}"


def test_the_default_options_add_nothing_to_the_schema():
    """`make finetune` with no arguments runs the schema's defaults: a disagreement between a dataclass default
    and the default option's YAML (the value that would win) fails here, key by key."""
    cfg = OmegaConf.to_container(compose_config("finetune"), resolve=True, enum_to_str=True)
    differ = {f"{g}.{k}": (cfg[g][k], v) for g in SETTINGS for k, v in SCHEMA[g].items() if cfg[g][k] != v}
    assert not differ, f"composed default vs schema default: {differ}"

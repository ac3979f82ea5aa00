"""`make evaluate`: a saved run's export or checkpoint on a split of its task or another file, with training's data
and metrics code, into its own RUN_DIR/evaluations/<name>/. `open_saved` and `SavedRun.load` are the one way a
saved run is opened, for `make evaluate` and `make predict`."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import yaml
from accelerate import Accelerator
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from transformers import AutoConfig, PretrainedConfig, PreTrainedTokenizerBase

from ampft import checkpointing, distributed, precision, tasks
from ampft.config import ConfigError, FinetuneConfig
from ampft.data import eval_dataloader, prepare_data
from ampft.errors import DataError, EvaluationError, ModelLoadError
from ampft.models import check_loadable, load_tokenizer_from, loading

log = logging.getLogger(__name__)


def _source(e: DictConfig) -> tuple[Path, Path, str]:
    """(run dir, folder with the weights, kind) from `run=` or `checkpoint=`."""
    if (e.run is None) == (e.checkpoint is None):
        raise EvaluationError("give exactly one of run=RUN_DIR (its exported model) or checkpoint=PATH")
    if e.checkpoint is not None:
        ckpt = Path(e.checkpoint)
        if problems := (checkpointing.verify(ckpt) if ckpt.is_dir() else ["no such folder"]):
            hint = (f" ({ckpt} is a run dir: run={ckpt} evaluates its export, checkpoint={ckpt}/checkpoints/step_N "
                    "one of its checkpoints)" if (ckpt / "checkpoints").is_dir() or (ckpt / "model").is_dir() else "")
            raise EvaluationError(f"checkpoint={ckpt} cannot be evaluated: {'; '.join(problems)}{hint}")
        return ckpt.parent.parent, ckpt, "checkpoint"
    run = Path(e.run)
    if not (run / "model" / "config.json").is_file():
        raise EvaluationError(f"run={run}: no exported model in {run / 'model'} (was checkpoint.export=false? "
                              "use checkpoint=RUN_DIR/checkpoints/step_N)")
    return run, run / "model", "run"


@dataclasses.dataclass
class SavedRun:
    """A saved run opened: its weights, and its config with the command line's changes (labels: the model's)."""

    run_dir: Path
    weights: Path  # RUN_DIR/model, or a checkpoint folder
    kind: str  # run | checkpoint: the command-line key that named it, for error messages
    cfg_path: Path  # the config.yaml the run (or checkpoint) was trained with
    cfg: DictConfig
    family: tasks.Family
    model_config: PretrainedConfig

    def load(self) -> tuple[Accelerator, str, PreTrainedTokenizerBase, Any]:
        """The Accelerator (precision applied), the precision that runs, the family's tokenizer, and the model with
        every saved weight (not yet prepared)."""
        cfg, family = self.cfg, self.family
        distributed.quiet_deepspeed()
        accelerator = Accelerator(**precision.accelerator_kwargs(cfg.precision), cpu=cfg.trainer.cpu)
        ran = precision.setup(accelerator, cfg.precision)
        tokenizer_dir = self.weights if self.kind == "run" else self.run_dir / "tokenizer"
        tokenizer = family.adapt_tokenizer(load_tokenizer_from(tokenizer_dir, "the run's tokenizer", self.kind))
        with loading("the saved model", self.kind, str(self.weights)):
            if self.kind == "checkpoint" and not (self.weights / "model.safetensors").is_file():
                raise EvaluationError(f"checkpoint={self.weights}: no model.safetensors (a checkpoint written by "
                                      "DeepSpeed or FSDP keeps its weights sharded: evaluate the run's export with "
                                      "run=RUN_DIR)")
            check_loadable(str(self.weights), "the saved model", self.kind, needs=("config", "weights"))
            # Shapes that differ are reported with the missing keys (and refused below), not raised.
            model, info = family.model_class.from_pretrained(self.weights, config=self.model_config,
                                                             output_loading_info=True, ignore_mismatched_sizes=True)
        missing = sorted({*info["missing_keys"], *(k[0] for k in info["mismatched_keys"])})
        check_weights(missing, sorted(info["unexpected_keys"]), f"{self.kind}={self.weights}")
        return accelerator, ran, tokenizer, model

    def output_dir(self, e: DictConfig, under: str) -> Path:
        """RUN_DIR/<under>/<name>, `name=` or one made of the weights, data and overrides: a rerun replaces it,
        another file of the same name gets the name with `-2`, `-3`, ... (what each folder holds is in its record).
        """
        if e.name is not None:
            if not re.fullmatch(r"[\w.=+-]+", str(e.name)) or str(e.name) in (".", ".."):
                raise EvaluationError(f"name={e.name}: use letters, digits and . _ - = + only (it names a folder "
                                      "under RUN_DIR/evaluations/ or RUN_DIR/predictions/)")
            return self.run_dir / under / str(e.name)
        parts = ["final" if self.kind == "run" else self.weights.name, Path(e.file).stem if e.file else e.split]
        if e.precision is not None:
            parts.append(f"precision-{e.precision}")
        if e.batch_size is not None:
            parts.append(f"batch-{e.batch_size}")
        base = self.run_dir / under / re.sub(r"[^\w.=+-]", "_", "_".join(parts))
        record, key = ("eval.json", "data") if under == "evaluations" else ("predict.json", "file")
        for n in itertools.count(1):
            out = base.with_name(base.name if n == 1 else f"{base.name}-{n}")
            try:
                held = Path(json.loads((out / record).read_text())[key]).resolve()
            except (OSError, ValueError, KeyError, TypeError):
                held = None  # a new folder, or one whose writing was cut short
            if not e.file or held is None or held == Path(e.file).resolve():
                if n > 1:
                    log.info("%s holds another file's output: this one goes to %s", base, out)
                return out


def check_weights(missing: list[str], unexpected: list[str], where: str) -> None:
    """Refuse weights that are not the model's, key for key: transformers would start a missing one from random."""
    parts = []
    if missing:
        parts.append(f"{len(missing)} of the model's weights are missing from it or of another shape "
                     f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}): they would start from random")
    if unexpected:
        hint = " (torch.compile's `_orig_mod.` prefix: an export of an older ampft)" if any(
            k.startswith("_orig_mod.") for k in unexpected) else ""
        parts.append(f"{len(unexpected)} of its weights are not the model's ({', '.join(unexpected[:5])}"
                     f"{', ...' if len(unexpected) > 5 else ''}){hint}")
    if parts:
        raise EvaluationError(f"{where}: the saved weights do not match the model: {'; '.join(parts)}. Not "
                              "loading them; use another checkpoint of the run (checkpoint=RUN_DIR/checkpoints/step_N)")


def open_saved(e: DictConfig) -> SavedRun:
    """The run or checkpoint that `run=`/`checkpoint=` name, with its config as trained plus `precision=`,
    `batch_size=` and the `task.<key>=` overrides (checked by the task family)."""
    run_dir, weights, key = _source(e)  # the kind is the key that named it: run or checkpoint
    cfg_path = (weights if key == "checkpoint" else run_dir) / "config.yaml"
    if not cfg_path.is_file():
        raise ModelLoadError(f"{key}={cfg_path.parent}: no {cfg_path.name}, the config the run was trained with (not "
                             "a folder written by an ampft run?)")
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(FinetuneConfig), OmegaConf.load(cfg_path))
    except (OmegaConfBaseException, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise ModelLoadError(f"{key}: {cfg_path} is not a config this ampft reads: {type(exc).__name__}: "
                             f"{first}") from exc
    check_loadable(str(weights), "the saved model", key, needs=("config",))
    with loading("the saved model's config", key, str(weights)):
        model_config = AutoConfig.from_pretrained(weights)
    family = tasks.family_for(cfg.task.family)
    # The ids the model was trained with, whatever the file's label order (none for regression and QA).
    cfg.task.labels = family.labels_from_model(model_config)
    if e.get("file") is not None:  # all of it: the run's sample limits apply to the run's own splits only
        cfg.task.max_train_samples = cfg.task.max_eval_samples = None
    if changed := {k: v for k, v in (e.get("task") or {}).items() if v is not None}:
        cfg.task.update(changed)
        if problems := family.check(cfg.task, [("file", e.file)] if e.get("file") else []):
            raise ConfigError(problems)
    if e.precision is not None:
        cfg.precision.name = str(e.precision)
    if e.batch_size is not None:
        if e.batch_size < 1:
            raise ConfigError([f"batch_size={e.batch_size}: must be >= 1, or left out for the run's own"])
        cfg.trainer.eval_batch_size = e.batch_size
    return SavedRun(run_dir, weights, key, cfg_path, cfg, family, model_config)


def evaluate_saved(e: DictConfig) -> dict[str, Any]:
    """Evaluate a saved run or checkpoint (recipes/eval.py); every rank evaluates its share, the main process writes
    <run>/evaluations/<name>/eval.json and alone gets its "path" in the result."""
    saved = open_saved(e)
    cfg, family, task = saved.cfg, saved.family, saved.cfg.task
    out_dir = saved.output_dir(e, "evaluations")
    if e.split not in ("train", "validation"):
        raise EvaluationError(f"split={e.split}: use split=validation or split=train (or file=PATH)")
    if e.file is not None:
        task.train_file = task.validation_file = e.file
    elif e.split == "train":  # the train data read as the validation split: evaluation features (NER, QA)
        task.validation_file, task.validation_split = task.train_file, task.train_split
        task.max_eval_samples = task.max_train_samples
    if e.file is not None or e.split == "train":
        task.extra_validation_splits = []  # one split is asked for

    try:  # before loading anything
        tasks.check_installed(task.metrics, key=f"{saved.cfg_path}: task.metrics")
    except ConfigError as exc:
        raise EvaluationError(exc.problems[0]) from exc
    accelerator, ran, tokenizer, model = saved.load()
    try:
        data = prepare_data(cfg, family, tokenizer, lambda: distributed.main_process_first(accelerator))
    except DataError as exc:  # the file was read as the train and the validation split: say it as given
        if e.file is None:
            raise
        said = str(exc)
        for old, new in ((f"task.train_file={e.file}", f"file={e.file}"),
                         (f"task.validation_file={e.file}", f"file={e.file}"),
                         ("Fix the data, or set task.labels=[...] to the full label list in id order.",
                          "The model was trained on these labels only: fix the file."),
                         ("Fix the data, or set task.labels=[...] to every tag in id order",
                          "The model was trained on these tags only: fix the file")):
            said = said.replace(old, new)
        raise DataError(re.sub(r"\bthe (train|validation) split\b", "the file", said)) from exc
    eval_dl, *extra_dls = [eval_dataloader(cfg, data, ds, tokenizer, accelerator.device, model)
                           for ds in (data.validation, *data.extra.values())]
    model, eval_dl, *extra_dls = accelerator.prepare(model, eval_dl, *extra_dls)
    if accelerator.is_main_process:
        if out_dir.exists():
            log.warning("replacing the earlier evaluation in %s, of the same weights, data, precision= and "
                        "batch_size= (name=NAME keeps both)", out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    started = time.perf_counter()
    loaders = dict(zip(["validation", *data.extra], [eval_dl, *extra_dls], strict=True))
    results = tasks.evaluate(accelerator, model, data, loaders, task, out_dir)
    labels = None if task.labels is None else [str(x) for x in task.labels]
    out = dict(name=out_dir.name, source=str(saved.weights), kind=saved.kind, data=e.file or f"{task.name}:{e.split}",
               precision=ran, eval_batch_size=cfg.trainer.eval_batch_size, num_processes=accelerator.num_processes,
               positive_label=family.positive_label(task, labels),
               metrics={k: v for k, v in results.items() if k != "samples"}, samples=results["samples"],
               seconds=time.perf_counter() - started)
    if accelerator.is_main_process:
        path = out_dir / "eval.json"
        path.write_text(json.dumps(out, indent=2) + "\n")
        log.info("evaluation of %s on %s: %s -> %s", saved.weights, out["data"], out["metrics"], path)
        out["path"] = str(path)
    return out

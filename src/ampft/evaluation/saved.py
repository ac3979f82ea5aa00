"""Evaluate a saved run (its exported model) or one of its checkpoints, on a split of the run's task or on
another local file, with the same data and metrics code as training. Each evaluation writes into its own
folder, RUN_DIR/evaluations/<name>/ (eval.json, and the predictions a family writes), named after what was
evaluated: `<final|step_N>_<split or file stem>[_precision-P][_batch-B]`. Nothing the training run wrote is
replaced."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer

from ampft import checkpointing, distributed, precision, tasks
from ampft.config import ConfigError, FinetuneConfig
from ampft.data import eval_dataloader, prepare_data
from ampft.errors import EvaluationError

log = logging.getLogger(__name__)


def _source(e: DictConfig) -> tuple[Path, Path, str]:
    """(run dir, folder with the weights, kind) from `run=` or `checkpoint=`."""
    if (e.run is None) == (e.checkpoint is None):
        raise EvaluationError("give exactly one of run=RUN_DIR (its exported model) or checkpoint=PATH")
    if e.checkpoint is not None:
        ckpt = Path(e.checkpoint)
        if problems := (checkpointing.verify(ckpt) if ckpt.is_dir() else ["no such folder"]):
            raise EvaluationError(f"checkpoint={ckpt} cannot be evaluated: {'; '.join(problems)}")
        return ckpt.parent.parent, ckpt, "checkpoint"
    run = Path(e.run)
    if not (run / "model" / "config.json").is_file():
        raise EvaluationError(f"run={run}: no exported model in {run / 'model'} (was checkpoint.export=false? "
                              "use checkpoint=RUN_DIR/checkpoints/step_N)")
    return run, run / "model", "run"


def evaluation_name(e: DictConfig, weights: Path, kind: str) -> str:
    """The folder name under RUN_DIR/evaluations/: `name=`, or the weights, the data and the overrides."""
    if e.name is not None:
        if not re.fullmatch(r"[\w.=+-]+", str(e.name)) or str(e.name) in (".", ".."):
            raise EvaluationError(f"name={e.name}: use letters, digits and . _ - = + only (it names a folder under "
                                  "RUN_DIR/evaluations/)")
        return str(e.name)
    parts = ["final" if kind == "run" else weights.name, Path(e.file).stem if e.file else e.split]
    if e.precision is not None:
        parts.append(f"precision-{e.precision}")
    if e.batch_size is not None:
        parts.append(f"batch-{e.batch_size}")
    return re.sub(r"[^\w.=+-]", "_", "_".join(parts))


def evaluate_saved(e: DictConfig) -> dict[str, Any]:
    run_dir, weights, kind = _source(e)
    name = evaluation_name(e, weights, kind)
    out_dir = run_dir / "evaluations" / name
    cfg_path = (weights if kind == "checkpoint" else run_dir) / "config.yaml"
    cfg = OmegaConf.merge(OmegaConf.structured(FinetuneConfig), OmegaConf.load(cfg_path))
    model_config = AutoConfig.from_pretrained(weights)
    task = cfg.task
    family = tasks.family_for(task.family)
    # The ids the model was trained with, whatever the file's label order (none for regression and QA).
    task.labels = family.labels_from_model(model_config)
    if e.file is not None:  # all of it; the run's sample limits apply to the run's own splits only
        task.train_file = task.validation_file = e.file
        task.max_train_samples = task.max_eval_samples = None
    if e.split not in ("train", "validation"):
        raise EvaluationError(f"split={e.split}: use split=validation or split=train (or file=PATH)")
    if e.file is not None or e.split == "train":
        task.extra_validation_splits = []  # one split is asked for
    if e.split == "train" and e.file is None and not family.evaluates_train_features:
        # NER and QA build evaluation features (word ids, offsets) for validation splits: read the train
        # data as the validation split.
        if task.train_file is not None:
            task.validation_file = task.train_file
        else:
            task.validation_split = task.train_split
        task.max_eval_samples = task.max_train_samples
    if e.precision is not None:
        cfg.precision.name = e.precision
    if e.batch_size is not None:
        cfg.trainer.eval_batch_size = e.batch_size

    try:  # before loading anything
        tasks.check_installed(task.metrics, key=f"{cfg_path}: task.metrics")
    except ConfigError as exc:
        raise EvaluationError(exc.problems[0]) from exc
    distributed.quiet_deepspeed()
    accelerator = Accelerator(**precision.accelerator_kwargs(cfg.precision), cpu=cfg.trainer.cpu)
    ran = precision.setup(accelerator, cfg.precision)
    tokenizer = AutoTokenizer.from_pretrained(weights if kind == "run" else run_dir / "tokenizer")
    tokenizer = family.adapt_tokenizer(tokenizer)
    data = prepare_data(cfg, family, tokenizer, accelerator.main_process_first)
    if e.split == "train" and e.file is None and family.evaluates_train_features:
        data = dataclasses.replace(data, validation=data.train)
    auto = family.model_class
    if kind == "run":
        model = auto.from_pretrained(weights)
    else:
        model = auto.from_config(model_config)
        model.load_state_dict(load_file(weights / "model.safetensors"), strict=False)
    eval_dl, *extra_dls = [eval_dataloader(cfg, data, ds, tokenizer, accelerator.device, model)
                           for ds in (data.validation, *data.extra.values())]
    model, eval_dl, *extra_dls = accelerator.prepare(model, eval_dl, *extra_dls)
    if accelerator.is_main_process:
        if out_dir.exists():
            log.warning("replacing the earlier evaluation in %s (same name: same weights, data and overrides)", out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    started = time.perf_counter()
    results = tasks.evaluate(accelerator, model, data, dict(zip(["validation", *data.extra], [eval_dl, *extra_dls],
                                                                strict=True)), task, out_dir)
    labels = None if task.labels is None else [str(x) for x in task.labels]
    out = dict(name=name, source=str(weights), kind=kind, data=e.file or f"{task.name}:{e.split}", precision=ran,
               eval_batch_size=cfg.trainer.eval_batch_size, num_processes=accelerator.num_processes,
               positive_label=family.positive_label(task, labels),
               metrics={k: v for k, v in results.items() if k != "samples"}, samples=results["samples"],
               seconds=time.perf_counter() - started)
    if accelerator.is_main_process:
        path = out_dir / "eval.json"
        path.write_text(json.dumps(out, indent=2) + "\n")
        log.info("evaluation of %s on %s: %s -> %s", weights, out["data"], out["metrics"], path)
        out["path"] = str(path)
    return out

"""`make predict`: a saved run's export or checkpoint on a file without labels, into RUN_DIR/predictions/<name>/
(predictions.jsonl: one object per input in file order, `index` from 0, then the family's row; predict.json; the
GLUE server's file under `format=glue`). Nothing the training run wrote is replaced."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from tqdm.auto import tqdm

from ampft.config import PredictFormat
from ampft.data import inference_dataloader, length_order
from ampft.errors import DataError, EvaluationError
from ampft.evaluation.saved import open_saved
from ampft.tasks.classification import glue

log = logging.getLogger(__name__)


def _check_file(path: Path, family) -> None:
    """A file that exists, in a format the family reads, with something in it."""
    if not path.is_file():
        raise DataError(f"file={path}: no such file")
    try:
        family.check_file(str(path))
    except ValueError as exc:
        raise DataError(f"file={exc}") from exc
    with path.open("rb") as f:
        while chunk := f.read(1 << 16):
            if chunk.strip():
                return
    raise DataError(f"file={path}: the file is empty (line 1 has nothing): nothing to predict")


def predict_saved(e: DictConfig) -> dict[str, Any]:
    """Predict `e.file` with a saved run or checkpoint (recipes/predict.py); every rank predicts its share, the main
    process writes <run>/predictions/<name>/ and alone gets its "path" in the result."""
    if e.file is None:
        raise EvaluationError("file=PATH is needed: the file to predict (csv/tsv/json/jsonl/parquet with the task's "
                              "text columns, CoNLL words, or SQuAD JSON questions)")
    saved = open_saved(e)
    cfg, family, task = saved.cfg, saved.family, saved.cfg.task
    path = Path(e.file)
    out_dir = saved.output_dir(e, "predictions")
    glue_file = glue.submission_file(task.name, str(path), task.labels) if e.format == PredictFormat.glue else None
    _check_file(path, family)
    inputs = family.read_inputs(task, str(path))
    if task.max_eval_samples is not None and len(inputs) > task.max_eval_samples:
        inputs = inputs.select(range(task.max_eval_samples))

    accelerator, ran, tokenizer, model = saved.load()
    features = family.input_features(inputs, task, tokenizer)
    # Longest first, as evaluation does: batches of similar lengths; one feature per example keeps its example
    # beside it (QA's windows find their question by id).
    order = length_order(features["length"][:])
    features = features.select(order)
    examples = inputs.select(order) if family.one_feature_per_example else inputs
    dataloader = inference_dataloader(cfg, family, features, tokenizer, accelerator.device, model)
    batch_size = dataloader.batch_size
    model, dataloader = accelerator.prepare(model, dataloader)
    started = time.perf_counter()
    bar = tqdm(dataloader, desc="predict", dynamic_ncols=True, disable=not accelerator.is_main_process)
    rows = family.predict(accelerator, model, bar, features, examples, task, task.labels)
    seconds = time.perf_counter() - started
    if family.one_feature_per_example:  # back to the file's order
        rows = [row for _, row in sorted(zip(order, rows, strict=True), key=lambda pair: pair[0])]
    rows = [{"index": i, **row} for i, row in enumerate(rows)]

    out = dict(name=out_dir.name, source=str(saved.weights), kind=saved.kind, file=str(path), task=task.name,
               precision=ran, eval_batch_size=batch_size, num_processes=accelerator.num_processes,
               samples=len(rows), seconds=seconds, files=["predictions.jsonl", *([glue_file] if glue_file else [])])
    if accelerator.is_main_process:
        if out_dir.exists():
            log.warning("replacing the earlier predictions in %s, of the same weights, file, precision= and "
                        "batch_size= (name=NAME keeps both)", out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        with (out_dir / "predictions.jsonl").open("w") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        if glue_file:
            indices = inputs["index"] if "index" in inputs.column_names else range(len(rows))
            (out_dir / glue_file).write_text(glue.submission(task.name, rows, list(indices), task.labels))
        (out_dir / "predict.json").write_text(json.dumps(out, indent=2) + "\n")
        out["path"] = str(out_dir)  # the main process's only: the one that wrote the files
    accelerator.wait_for_everyone()
    return out

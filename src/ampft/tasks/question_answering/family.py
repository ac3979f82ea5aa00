"""Extractive question answering (SQuAD v1.1 / v2.0), task.family=question_answering: a Hub dataset with `id`,
question, context and SQuAD-style answers columns, or SQuAD JSON files. Evaluation writes
`predictions_<split>.json` ({id: text}, the official script's input)."""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from datasets import Dataset, DatasetDict
from omegaconf import DictConfig
from torch.utils.data import DataLoader
from transformers import AutoModelForQuestionAnswering, PreTrainedTokenizerBase

from ampft.data.load import PREDICT, check_columns, load_splits, read_checked
from ampft.errors import DataError
from ampft.tasks.base import Family, column_names_unread, gather, register, rows
from ampft.tasks.question_answering import squad, squad_metric

NEG = -1e4  # logits of positions past a feature (padding across ranks); never inside its context
# The model card's example (`usage`): a question and its context.
EXAMPLE = ("Where did Apollo 11 land?", "Apollo 11 landed on the Moon in July 1969, and its crew returned safely.")


def _span_logits(out) -> tuple[torch.Tensor, torch.Tensor]:
    return out.start_logits.float(), out.end_logits.float()


def window_losses(start_logits: torch.Tensor, end_logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """Each window's loss, (start + end cross-entropy) / 2 as the model's, with padding kept out of the softmax so
    it does not depend on the batch's width (training's own loss trains the padding logits down: they agree)."""
    pad = batch["attention_mask"] == 0
    loss = 0.0
    for logits, gold in ((start_logits, batch["start_positions"]), (end_logits, batch["end_positions"])):
        logits = logits.float().masked_fill(pad, float("-inf"))
        loss = loss + torch.nn.functional.cross_entropy(logits, gold, reduction="none")
    return loss / 2


class QuestionAnswering(Family):
    name = "question_answering"
    metrics = {"squad": ("exact_match", "f1"), "squad_v2": ("exact_match", "f1")}  # in percent, as the official script
    model_class = AutoModelForQuestionAnswering
    pipeline_tag = "question-answering"
    model_inputs = ("input_ids", "attention_mask", "token_type_ids", "start_positions", "end_positions")
    extensions = (".json",)
    files = 'SQuAD JSON: .json with a top-level "data" list of articles'
    one_feature_per_example = False
    scores_in_percent = True
    typical_label_count = None

    def check(self, task: DictConfig, files: list[tuple[str, str]]) -> list[str]:
        problems = column_names_unread(task)
        if len(task.text_fields) != 2:
            problems.append(f"task.text_fields={list(task.text_fields)}: task.family={self.name} needs two columns: "
                            "[question, context]")
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
        return problems

    def load(self, task: DictConfig) -> tuple[DatasetDict, None]:
        raw = load_splits(task, _read)
        question, context = task.text_fields
        renames = {question: "question", context: "context", task.label_column: "answers"}
        out = {}
        for split, ds in raw.items():
            check_columns(ds, ["id", *renames], f"task={task.name}", split,
                          "Set task.text_fields=[<question>, <context>] and task.label_column=<answers>.")
            renamed = ds.select_columns(["id", *renames]).rename_columns({a: b for a, b in renames.items() if a != b})
            out[split] = renamed.select_columns(squad.COLUMNS)
            squad.check_answers(out[split], task, split)
        return DatasetDict(out), None

    def read_inputs(self, task: DictConfig, path: str) -> Dataset:
        ds = _read(path, PREDICT, answers=False).select_columns(["id", "question", "context"])
        repeated = [i for i, n in Counter(ds["id"]).items() if n > 1]
        if repeated:
            raise DataError(f"file={path}: question ids {repeated[:5]} appear more than once; each answer is "
                            "reported by its question's id: give every question its own id")
        return ds

    def predict(self, accelerator: Accelerator, model, dataloader: DataLoader, features: Dataset,
                inputs: Dataset, task: DictConfig, labels: list[str] | None) -> list[dict[str, Any]]:
        parts = gather(accelerator, model, dataloader, lambda _, out: _span_logits(out), pad=NEG)
        answers = _answers(task, inputs, features, *parts)
        return [{"id": i, "answer": answers[i][0], "score": answers[i][1]} for i in inputs["id"]]

    def usage_example(self, task: DictConfig) -> str:
        question, context = (json.dumps(t) for t in EXAMPLE)
        cls = ("\ncls = inputs.input_ids[0].tolist().index(tokenizer.cls_token_id)  # where \"no answer\" points"
               "\nallowed[cls] = True") if task.version_2 else ""
        null = (f"""
null = start_logp[cls] + end_logp[cls]
if null - logp > {task.null_threshold}:  # SQuAD 2.0: no answer wins by more than task.null_threshold
    answer, probability = "", null.exp().item()""") if task.version_2 else ""
        return f"""question, context = {question}, {context}
# One window of {task.max_length} tokens (`make predict` slides windows over longer contexts).
inputs = tokenizer(question, context, truncation="only_second", max_length={task.max_length},
                   return_offsets_mapping=True, return_tensors="pt")
offsets = inputs.pop("offset_mapping")[0].tolist()
in_context = torch.tensor([s == 1 for s in inputs.sequence_ids(0)])
allowed = in_context.clone(){cls}
with torch.inference_mode():
    out = model(**inputs)
start_logp = out.start_logits[0].masked_fill(~allowed, -torch.inf).log_softmax(-1)
end_logp = out.end_logits[0].masked_fill(~allowed, -torch.inf).log_softmax(-1)
# The best span inside the context, start <= end, at most {task.max_answer_length} tokens.
n = len(start_logp)
spans = torch.ones(n, n, dtype=torch.bool).triu().tril({task.max_answer_length - 1}) & in_context[:, None] & in_context[None, :]
scores = (start_logp[:, None] + end_logp[None, :]).masked_fill(~spans, -torch.inf)
start, end = divmod(int(scores.argmax()), n)
logp = scores[start, end]
answer, probability = context[offsets[start][0]:offsets[end][1]], logp.exp().item(){null}
print({{"answer": answer, "score": probability}})
"""

    def fake_targets(self, batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
        return dict(start_positions=torch.zeros(batch_size, dtype=torch.long),
                    end_positions=torch.zeros(batch_size, dtype=torch.long))

    def model_kwargs(self, labels: list[str] | None) -> dict:
        return {}  # start and end logits: no label set

    def cache_settings(self, task: DictConfig) -> dict:
        return {"doc_stride": task.doc_stride}

    def encoder(self, task: DictConfig, tokenizer: PreTrainedTokenizerBase, labels: list[str] | None, split: str):
        # Validation windows carry the span search's inputs, and their gold positions for a loss.
        return functools.partial(squad.prepare_features, tokenizer=tokenizer, max_length=task.max_length,
                                 doc_stride=task.doc_stride, evaluation=split != "train")

    def evaluate(self, accelerator: Accelerator, model, dataloader: DataLoader, features: Dataset,
                 examples: Dataset, task: DictConfig, labels: list[str] | None,
                 out_dir: Path | None = None, name: str = "validation") -> dict[str, float]:
        def outputs(batch, out):
            return *_span_logits(out), window_losses(out.start_logits, out.end_logits, batch)

        start_parts, end_parts, losses = gather(accelerator, model, dataloader, outputs, pad=NEG)
        answers = {k: text for k, (text, _) in _answers(task, examples, features, start_parts, end_parts).items()}
        gold = dict(zip(examples["id"], examples["answers"], strict=True))
        results = squad_metric.scores(answers, gold, version_2=task.version_2)
        if out_dir is not None and accelerator.is_main_process:
            (Path(out_dir) / f"predictions_{name}.json").write_text(json.dumps(answers, indent=1, ensure_ascii=False))
        results["loss"] = float(torch.cat(losses).mean())  # over windows (features), as training averages
        results["samples"] = len(examples)
        return results


def _answers(task: DictConfig, examples: Dataset, features: Dataset, start_parts: list[torch.Tensor],
             end_parts: list[torch.Tensor]) -> dict[str, tuple[str, float]]:
    return squad.scored_answers(examples, features, rows(start_parts), rows(end_parts), n_best=task.n_best,
                                max_answer_length=task.max_answer_length, version_2=task.version_2,
                                null_threshold=task.null_threshold)


def _read(path: str, split: str, answers: bool = True) -> Dataset:
    return read_checked(lambda: squad.read_squad(path, answers), path, split, "questions")


QUESTION_ANSWERING = register(QuestionAnswering())

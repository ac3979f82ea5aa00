"""The GLUE test server's submission files (`make predict format=glue`): one TSV per test set named as the server
expects (SST-2.tsv, MNLI-m.tsv, ...), a header `index<TAB>prediction`, a line per test example by its `index`.
CoLA, SST-2, MRPC, QQP and WNLI take label ids (0/1), MNLI (and AX), QNLI and RTE label names, STS-B the score."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ampft.errors import EvaluationError

# task.name -> the submission file; MNLI's by its test file (`mnli_file`).
FILES = {"cola": "CoLA.tsv", "sst2": "SST-2.tsv", "mrpc": "MRPC.tsv", "qqp": "QQP.tsv", "stsb": "STS-B.tsv",
         "qnli": "QNLI.tsv", "rte": "RTE.tsv", "wnli": "WNLI.tsv", "mnli": None}
# The label names in the server's id order: ids are written for these tasks ...
BY_ID = {"cola": ["unacceptable", "acceptable"], "sst2": ["negative", "positive"],
         "mrpc": ["not_equivalent", "equivalent"], "qqp": ["not_duplicate", "duplicate"],
         "wnli": ["not_entailment", "entailment"]}
# ... and names for these.
BY_NAME = {"mnli": ["entailment", "neutral", "contradiction"], "qnli": ["entailment", "not_entailment"],
           "rte": ["entailment", "not_entailment"]}


def submission_file(task_name: str, path: str, labels: list[str] | None) -> str:
    """The server's file name for predictions of `path`, a test file of task `task_name`, by a model with
    `labels` (each must be one the server reads: refused before anything is predicted)."""
    if task_name not in FILES:
        raise EvaluationError(f"format=glue: the run's task is {task_name!r}, not a GLUE task ({sorted(FILES)}); "
                              "use format=jsonl")
    for label in labels or []:
        _server_label(task_name, label, labels)
    if task_name != "mnli":
        return FILES[task_name]
    stem = Path(path).stem.lower()
    for part, name in (("mismatched", "MNLI-mm.tsv"), ("matched", "MNLI-m.tsv"), ("diagnostic", "AX.tsv")):
        if part in stem or (stem == "ax" and name == "AX.tsv"):
            return name
    raise EvaluationError(f"format=glue: file={path}: an MNLI model predicts three GLUE test sets; name the file as "
                          "GLUE does (test_matched.tsv, test_mismatched.tsv, or diagnostic.tsv for AX) to say which")


def _server_label(task_name: str, label: str, labels: list[str]) -> str:
    names = BY_ID.get(task_name) or BY_NAME[task_name]
    if label in names:
        return str(names.index(label)) if task_name in BY_ID else label
    if label.isdigit() and int(label) < len(names):  # ids as labels (a file with 0/1 labels)
        return label if task_name in BY_ID else names[int(label)]
    raise EvaluationError(f"format=glue: the model's labels {labels} are not GLUE's {task_name} labels {names} (nor "
                          "their ids): the server could not read its predictions")


def submission(task_name: str, rows: list[dict[str, Any]], indices: list[Any], labels: list[str] | None) -> str:
    """The file's text: the header, then `index<TAB>prediction` per row (a `label`, or a regression `value`)."""
    lines = ["index\tprediction"]
    for index, row in zip(indices, rows, strict=True):
        prediction = f"{row['value']:.3f}" if "value" in row else _server_label(task_name, row["label"], labels)
        lines.append(f"{index}\t{prediction}")
    return "\n".join(lines) + "\n"

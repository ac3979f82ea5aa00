"""Every GLUE task config's documented local-file command (its header comment) loads the GLUE files exactly as
distributed: files written here in the official layouts (header or not, column names, BOM, quote characters
in the text), and the real CoLA/MRPC/RTE/SST-2 files of ../shared/data where present."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import datasets
import pytest

from ampft.config import ConfigError
from ampft.data.load import DataError
from ampft.finetune import run
from ampft.tasks import family_for
from ampft.tasks.classification.data import positive_label
from ampft.validation import validate
from tests.helpers import CONF, ROOT, TINY, command_lines, compose_config, shared

GLUE = ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"]
QUOTED = 'he said " the witness " , \'twice\' and "again'  # GLUE text keeps unbalanced quotes as text


def documented_command(task: str) -> list[str]:
    """The Hydra overrides of the `make finetune ...` line (with its continuations) in conf/task/<task>.yaml."""
    lines = [x[1:].strip() for x in (CONF / "task" / f"{task}.yaml").read_text().splitlines() if x.startswith("#")]
    start = next(i for i, x in enumerate(lines) if x.startswith("make finetune") and "task.train_file=" in x)
    text = lines[start]
    while text.endswith("\\"):
        start += 1
        text = text[:-1] + " " + lines[start]
    words = shlex.split(text)
    assert words[:2] == ["make", "finetune"]
    return words[2:]


def _rows(header: list[str] | None, rows: list[list[str]]) -> str:
    return "".join("\t".join(r) + "\n" for r in ([header] if header else []) + rows)


def _glue_layouts() -> dict[str, dict[str, str]]:
    """{GLUE folder: {file name: content}} in the layouts of the official GLUE download."""
    pair_nli = ["index", "sentence1", "sentence2", "label"]
    mnli_parse = ["( a b )", "( c d )", "(ROOT (S a b))", "(ROOT (S c d))"]
    mnli_head = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                 "sentence1_parse", "sentence2_parse", "sentence1", "sentence2"]

    def mnli(labels, dev):
        head = mnli_head + (["label1", "label2", "label3", "label4", "label5"] if dev else ["label1"]) + ["gold_label"]
        rows = [[str(i), "1", f"{i}e", "fiction", *mnli_parse, f"{QUOTED} {i}", f"premise {i}",
                 *([lab] * (5 if dev else 1)), lab] for i, lab in enumerate(labels)]
        return _rows(head, rows)

    return {
        "CoLA": {f: _rows(None, [["gj04", "1", "", f"{QUOTED} one."], ["gj04", "0", "*", "They drank the pub."],
                                 ["cj99", "1", "", "Bill broke the bathtub."]]) for f in ("train.tsv", "dev.tsv")},
        "SST-2": {f: _rows(["sentence", "label"], [[f"{QUOTED} ", "1"], ["a dull , lifeless film ", "0"],
                                                   ["charming ", "1"]]) for f in ("train.tsv", "dev.tsv")},
        "MRPC": {f: "\ufeff" + _rows(["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                                     [["1", "702876", "702977", QUOTED, "Referring to him as \" the witness \" ."],
                                      ["0", "2108705", "2108831", "Yucaipa owned Dominick 's .", "Yucaipa sold it ."],
                                      ["1", "1330381", "1330521", "They had 10 .", "They had ten ."]])
                 for f in ("train.tsv", "dev.tsv")},
        "QQP": {f: _rows(["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                         [["0", "1", "2", QUOTED, "What is it?", "0"], ["1", "3", "4", "How?", "How so?", "1"],
                          ["2", "5", "6", "Why?", "Why not?", "0"]]) for f in ("train.tsv", "dev.tsv")},
        "STS-B": {f: _rows(["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
                            "sentence2", "score"],
                           [["0", "main-captions", "MSRvid", "2012test", "0001", "none", "none", QUOTED,
                             "A plane is taking off.", "5.000"],
                            ["1", "main-captions", "MSRvid", "2012test", "0004", "none", "none", "A man plays.",
                             "A man sings.", "1.250"],
                            ["2", "main-news", "MSRpar", "2012train", "0005", "none", "none", "Cats.", "Dogs.",
                             "0.000"]]) for f in ("train.tsv", "dev.tsv")},
        "MNLI": {"train.tsv": mnli(["neutral", "entailment", "contradiction"], dev=False),
                 "dev_matched.tsv": mnli(["contradiction", "neutral", "entailment"], dev=True),
                 "dev_mismatched.tsv": mnli(["entailment", "entailment", "neutral"], dev=True)},
        "QNLI": {f: _rows(["index", "question", "sentence", "label"],
                          [["0", QUOTED, "It is.", "entailment"], ["1", "Who?", "Nobody.", "not_entailment"],
                           ["2", "When?", "Then.", "entailment"]]) for f in ("train.tsv", "dev.tsv")},
        "RTE": {f: _rows(pair_nli, [["0", QUOTED, "It is.", "not_entailment"], ["1", "A b.", "A.", "entailment"],
                                    ["2", "C d.", "D.", "entailment"]]) for f in ("train.tsv", "dev.tsv")},
        "WNLI": {f: _rows(pair_nli, [["0", QUOTED, "It is.", "1"], ["1", "A b.", "A.", "0"], ["2", "C.", "D.", "1"]])
                 for f in ("train.tsv", "dev.tsv")},
    }


# What each file above holds, as the task reads it: (label ids or scores of the train rows, first train text).
EXPECTED = {
    "cola": ([1, 0, 1], f"{QUOTED} one."),
    "sst2": ([1, 0, 1], f"{QUOTED} "),
    "mrpc": ([1, 0, 1], QUOTED),
    "qqp": ([0, 1, 0], QUOTED),
    "stsb": ([5.0, 1.25, 0.0], QUOTED),
    "mnli": ([1, 0, 2], f"{QUOTED} 0"),  # labels [entailment, neutral, contradiction]
    "qnli": ([0, 1, 0], QUOTED),
    "rte": ([1, 0, 0], QUOTED),
    "wnli": ([1, 0, 1], QUOTED),  # labels [not_entailment, entailment]; the file's 1 is entailment
}


@pytest.fixture(autouse=True)
def _own_datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


@pytest.fixture
def glue_data(tmp_path) -> Path:
    root = tmp_path / "glue_data"
    for folder, files in _glue_layouts().items():
        (root / folder).mkdir(parents=True)
        for name, content in files.items():
            (root / folder / name).write_text(content, encoding="utf-8")
    return root


def _with_files(overrides: list[str], root: Path) -> list[str]:
    return [o.replace("glue_data/", f"{root}/") for o in overrides]


@pytest.mark.parametrize("task", GLUE)
def test_documented_command_loads_the_official_layout(task, glue_data):
    cfg = compose_config("finetune", _with_files(documented_command(task), glue_data))
    validate(cfg)
    raw, labels = family_for(cfg.task.family).load(cfg.task)
    wanted_labels, first_text = EXPECTED[task]
    assert len(raw["train"]) == len(raw["validation"]) == 3  # no row lost to a header, none gained from one
    assert raw["train"]["labels"] == pytest.approx(wanted_labels)
    assert raw["train"][0][cfg.task.text_fields[0]] == first_text
    if task == "mnli":
        assert list(raw) == ["train", "validation", "dev_mismatched"]
        assert raw["dev_mismatched"]["labels"] == [0, 0, 1]
    if labels is not None and len(labels) == 2:
        assert positive_label(cfg.task, labels) == cfg.task.positive_label


def test_mrpc_command_goes_through_make_as_written(glue_data):
    """The quoting of the MRPC command (`#`, spaces) survives make and Hydra's override grammar."""
    words = _with_files(documented_command("mrpc"), glue_data)
    proc = subprocess.run(["make", "--no-print-directory", "print-config", *words, f"PYTHON={sys.executable}"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "- '#1 String'" in proc.stdout and "label_column: Quality" in proc.stdout


def test_headerless_cola_without_column_names_is_refused(glue_data):
    """The first sentence would become the header: the missing `label` column is named, with the fix."""
    cfg = compose_config("finetune", ["task=cola", f"task.train_file={glue_data}/CoLA/train.tsv",
                                      f"task.validation_file={glue_data}/CoLA/dev.tsv"])
    with pytest.raises(DataError, match="column"):
        family_for(cfg.task.family).load(cfg.task)


def test_column_names_must_match_the_field_count_and_name_the_used_columns(glue_data):
    files = [f"task.train_file={glue_data}/CoLA/train.tsv", f"task.validation_file={glue_data}/CoLA/dev.tsv"]
    cfg = compose_config("finetune", ["task=cola", *files, "task.column_names=[label,sentence]"])
    with pytest.raises(DataError, match=r"4 fields .* task.column_names names 2"):
        family_for(cfg.task.family).load(cfg.task)
    with pytest.raises(ConfigError, match=r"lacks \['sentence'\]"):
        validate(compose_config("finetune", ["task=cola", *files, "task.column_names=[a,label,b,c]"]))


def test_binary_f1_scores_the_positive_label_as_scikit_learn_does(glue_data, tmp_path):
    """Two string labels sorting the 'wrong' way: F1 is of task.positive_label, whatever the order; without
    it and without a label named 1/true/positive, f1 is refused with the key to set."""
    from sklearn.metrics import f1_score

    from ampft.tasks.classification.metrics import compute

    refs, preds = [0, 0, 0, 1, 1, 0, 1], [0, 1, 0, 1, 0, 0, 0]
    for positive in (0, 1):
        assert compute(["f1"], preds, refs, num_labels=2, positive=positive)["f1"] == pytest.approx(
            f1_score(refs, preds, pos_label=positive))
    data = tmp_path / "cola.csv"
    data.write_text("sentence,label\na,acceptable\nb,unacceptable\n")
    base = ["task=csv", f"task.train_file={data}", f"task.validation_file={data}"]
    cfg = compose_config("finetune", base)
    with pytest.raises(DataError, match="task.positive_label=acceptable or task.positive_label=unacceptable"):
        family_for(cfg.task.family).load(cfg.task)
    cfg = compose_config("finetune", [*base, "task.positive_label=acceptable"])
    _, labels = family_for(cfg.task.family).load(cfg.task)
    assert labels == ["acceptable", "unacceptable"] and positive_label(cfg.task, labels) == "acceptable"
    for values, positive in ((["0", "1"], "1"), (["False", "True"], "True"), (["negative", "positive"], "positive")):
        cfg = compose_config("finetune", base)
        assert positive_label(cfg.task, values) == positive
    with pytest.raises(ConfigError, match="task.positive_label=good"):
        validate(compose_config("finetune", ["task=cola", "task.positive_label=good"]))


# ---------------------------------------------------------------------------------------------------------
# the real GLUE files (../shared/data): CoLA headerless, MRPC with BOM and its own names, RTE, SST-2


def _real(task: str, folder: str, train: str = "train.tsv", dev: str = "dev.tsv") -> list[str]:
    words = documented_command(task)
    return [w.replace(f"glue_data/{folder}/train.tsv", str(shared(task, train)))
            .replace(f"glue_data/{folder}/dev.tsv", str(shared(task, dev))) for w in words]


@pytest.mark.data
def test_real_cola_as_distributed():
    cfg = compose_config("finetune", _real("cola", "CoLA"))
    raw, labels = family_for(cfg.task.family).load(cfg.task)
    # SOURCE.md: dev has 1,043 rows (721 acceptable / 322 not), train 7,250; the first row is not lost.
    assert (len(raw["train"]), len(raw["validation"])) == (7250, 1043)
    assert Counter(raw["validation"]["labels"]) == {1: 721, 0: 322}
    assert labels == ["unacceptable", "acceptable"] and positive_label(cfg.task, labels) == "acceptable"


@pytest.mark.data
def test_real_mrpc_rte_sst2_as_distributed():
    for task, folder, train, n_train, n_dev in (("mrpc", "MRPC", "train.tsv", 3668, 408),
                                                ("rte", "RTE", "train.tsv", 2127, 277),
                                                ("sst2", "SST-2", "train_first1000.tsv", 1000, 872)):
        cfg = compose_config("finetune", _real(task, folder, train))
        validate(cfg)
        raw, _ = family_for(cfg.task.family).load(cfg.task)
        assert (len(raw["train"]), len(raw["validation"])) == (n_train, n_dev), task


@pytest.mark.slow
@pytest.mark.parametrize("task", ["cola", "mrpc"])
def test_tiny_training_run_on_the_official_layout(task, glue_data, tmp_path):
    summary = run(compose_config("finetune", [*TINY, *_with_files(documented_command(task), glue_data),
                                              "trainer.max_steps=2", "checkpoint.every=0"]), tmp_path / "run")
    assert summary["eval_samples"] == 3 and summary["steps"] == 2
    assert summary["positive_label"] == {"cola": "acceptable", "mrpc": "equivalent"}[task]


def _documented_commands() -> list[list[str]]:
    """The `make finetune|reproduce ...` lines of README.md and docs/*.md that read local GLUE, SST-2, CoNLL or
    SQuAD files."""
    lines = [x for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
             for x in page.read_text().splitlines()]
    out = []
    for text in command_lines(lines):
        words = shlex.split(text.split("  #")[0]) if text.startswith(("make finetune", "make reproduce")) else []
        if any(w.startswith("task.train_file=") and w.split("=", 1)[1].startswith(("glue_data/", "conll2003/",
                                                                                     "squad/", "sst2/"))
               for w in words):
            out.append(words[2:])
    return out


def test_documented_local_file_commands_load_the_files(glue_data):
    """Every documented command for local GLUE/CoNLL/SQuAD files, with its paths pointed at the files written here
    (GLUE layouts) or at the real ones in ../shared/data, validates and loads."""
    commands = _documented_commands()
    assert len(commands) >= 10
    conll, squad, sst2 = shared("conll2003"), shared("squad", "expmrc-squad-dev.json"), shared("sst2")
    for words in commands:
        words = [w.replace("glue_data/", f"{glue_data}/").replace("conll2003/", f"{conll}/")
                 .replace("sst2/", f"{sst2}/").replace("squad/train-v1.1.json", str(squad))
                 .replace("squad/dev-v1.1.json", str(squad)) for w in words if not w.startswith(("steps=", "minutes="))]
        cfg = compose_config("finetune", words)
        validate(cfg)
        raw, _ = family_for(cfg.task.family).load(cfg.task)
        assert len(raw["train"]) > 0 and len(raw["validation"]) > 0, words

"""Shared test helpers: paths, the tiny-run overrides, config composition, real-data lookup. Tests import these
from here (`from tests.helpers import ...`); tests/conftest.py holds only fixtures."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SHARED_DATA = Path(os.environ.get("AMPFT_SHARED_DATA", ROOT.parent / "shared" / "data"))

# A fast, real run: tiny BERT, short sequences, a few dozen steps. Logging and the progress bar stay as shipped
# (TensorBoard, on): the tests run the path users run.
TINY = [
    "model=tiny-bert",
    "trainer.batch_size=16",
    "trainer.log_every=5",
    "optim.lr=1e-3",
    "task.max_train_samples=640",
    "task.max_eval_samples=101",
]


def compose_config(config_name: str, overrides: list[str] | None = None, **kwargs):
    """A primary config from conf/ (finetune, benchmark_recipe) composed as its recipe composes
    it, without Hydra's runtime. The recipes' schemas are registered on import of their modules."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import ampft.benchmark.config  # noqa: F401  (registers benchmark_recipe)
    import ampft.config  # noqa: F401  (registers finetune_schema)

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides or []), **kwargs)


def shared(*parts: str) -> Path:
    """A file or folder of the real data (../shared/data, or $AMPFT_SHARED_DATA); skips the test when absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real data not present: {path}")
    return path


def command_lines(lines: list[str]) -> list[str]:
    """A page's lines as a shell reads them: a line ending in a backslash continues on the next one, and so
    does a line inside an open quote."""
    out, i = [], 0
    while i < len(lines):
        text = lines[i].strip()
        while i + 1 < len(lines) and (text.endswith("\\") or _open_quote(text)):
            i += 1
            text = (text[:-1] if text.endswith("\\") else text) + " " + lines[i].strip()
        i += 1
        out.append(text)
    return out


def _open_quote(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:  # "No closing quotation"
        return True
    return False


def assert_export_reproduces(run_dir: Path) -> dict:
    """The run's exported folder, reloaded as a user reloads it (`make evaluate run=RUN_DIR`: `from_pretrained`,
    the run's precision, one process), scores exactly what the run's final evaluation scored: every metric and
    the loss. Also every weight of the model is in the export (from_pretrained would start a missing one from
    random weights, with only a warning). Returns the reloaded evaluation."""
    import json
    import subprocess
    import sys

    from ampft.tasks import family_for

    summary = json.loads((run_dir / "summary.json").read_text())
    _, info = family_for(summary["task_family"]).model_class.from_pretrained(run_dir / "model",
                                                                               output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    proc = subprocess.run([sys.executable, "recipes/eval.py", f"run={run_dir}", "name=export-check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reloaded = json.loads((run_dir / "evaluations" / "export-check" / "eval.json").read_text())
    assert reloaded["metrics"] == summary["eval"], (reloaded["metrics"], summary["eval"])
    assert reloaded["samples"] == summary["eval_samples"]
    return reloaded


# ---- small files of each task family, and tiny runs trained on them ---------------------------------------

TEXT = ("the screen is superb and the battery lasts all day long . the case felt flimsy and it broke within a "
        "week of use . service was quick")


def _sentence(i: int, n: int) -> str:
    words = TEXT.split(" ")
    return " ".join(words[(i * 7 + k) % len(words)] for k in range(n))


def family_files(folder: Path) -> dict[str, Path]:
    """Training files for each kind of run (`FAMILY_RUNS`): GLUE-style TSVs (SST-2: sentence, label 0/1; RTE:
    sentence pairs with label names; STS-B: pairs with a score), CoNLL, SQuAD v1.1 and v2.0 JSON."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    out = {name: folder / name for name in ("sst2.tsv", "rte.tsv", "stsb.tsv", "ner.txt", "squad.json",
                                             "squad_v2.json")}
    rows = [(_sentence(i, 3 + i % 9), i % 2) for i in range(48)]
    out["sst2.tsv"].write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    out["rte.tsv"].write_text("index\tsentence1\tsentence2\tlabel\n" + "".join(
        f"{i}\t{s}\t{_sentence(i + 3, 4)}\t{'entailment' if y else 'not_entailment'}\n" for i, (s, y) in enumerate(rows)))
    out["stsb.tsv"].write_text("index\tsentence1\tsentence2\tscore\n" + "".join(
        f"{i}\t{s}\t{_sentence(i + 1, 5)}\t{(i % 11) / 2:.1f}\n" for i, (s, _) in enumerate(rows)))
    out["ner.txt"].write_text("EU B-ORG\nrejects O\nGerman B-MISC\ncall O\n\nPeter B-PER\nBlackburn I-PER\n\n"
                              "BRUSSELS B-LOC\n1996-08-22 O\n\n" * 6)
    context = "Apollo 11 landed on the Moon in 1969. " + "The crew trained for years. " * 12
    qas = [{"id": f"q{i}", "question": q, "answers": [{"text": a, "answer_start": context.index(a)}]}
           for i, (q, a) in enumerate([("When did Apollo 11 land?", "1969"), ("Where did it land?", "the Moon")] * 4)]
    out["squad.json"].write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": context,
                                                                                       "qas": qas}]}]}))
    impossible = [{"id": f"n{i}", "question": "Who painted the Mona Lisa?", "answers": [], "is_impossible": True}
                  for i in range(4)]
    out["squad_v2.json"].write_text(json.dumps({"version": "v2.0", "data": [
        {"title": "t", "paragraphs": [{"context": context, "qas": qas + impossible}]}]}))
    return out


def family_run_overrides(kind: str, files: dict[str, Path]) -> list[str]:
    """TINY plus the task overrides that train the kind of run `kind` on `family_files`' file for it."""
    def local(name: str, path: Path, *more: str) -> list[str]:
        return [f"task={name}", f"task.train_file={path}", f"task.validation_file={path}", *more]

    return [*TINY, "trainer.max_steps=6", *{
        "sst2": local("sst2", files["sst2.tsv"]),
        "rte": local("rte", files["rte.tsv"]),
        "stsb": local("stsb", files["stsb.tsv"], "task.label_column=score"),
        "ner": local("conll2003", files["ner.txt"], "task.max_length=32"),
        "squad": local("squad", files["squad.json"], "task.max_length=48", "task.doc_stride=16"),
        "squad_v2": local("squad_v2", files["squad_v2.json"], "task.max_length=48", "task.doc_stride=16"),
    }[kind]]

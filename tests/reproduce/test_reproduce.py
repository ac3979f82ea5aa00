"""`make reproduce`: a paper recipe on a step or time budget, its scores next to the published ones."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from ampft.errors import ConfigError
from ampft.reproduce import _budget, report
from tests.helpers import CONF, ROOT, TINY, compose_config, shared

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def _make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "reproduce", *args, f"PYTHON={sys.executable}"],
                          cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_paper_recipe_names_its_published_scores_among_its_results(experiment):
    from ampft.validation import metric_keys

    cfg = compose_config("finetune", [f"experiment={experiment}"])
    assert cfg.published.source and cfg.published.split and cfg.published.scores
    keys = metric_keys(cfg.task)
    for metric in cfg.published.scores:
        split, _, key = metric.rpartition("/")
        assert key in keys and (not split or split in cfg.task.extra_validation_splits), metric


@pytest.mark.slow
def test_steps_budget_on_real_sst2(tmp_path):
    sst2 = shared("sst2")
    run_dir = tmp_path / "run"
    proc = _make("experiment=sst2-bert-base", *TINY, f"task.train_file={sst2 / 'train_first1000.tsv'}",
                 f"task.validation_file={sst2 / 'dev.tsv'}", "task.max_eval_samples=64", "steps=6",
                 "trainer.log_every=2", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((run_dir / "reproduce.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert data["budget"] == {"steps": 6} and data["used"]["steps"] == summary["steps"] == 6
    assert data["model"] == "tiny-bert" and data["recipe_model"] == "bert-base"
    [row] = data["scores"]
    assert row["metric"] == "accuracy" and row["published"] == 93.5
    assert row["run"] == pytest.approx(100 * summary["eval"]["accuracy"])  # percent, like the paper
    assert [s for s, _ in data["train_losses"]] == [2, 4, 6]
    text = (run_dir / "reproduce.md").read_text()
    assert "These are not the published numbers" in text and "bert-base" in text and "| accuracy |" in text
    assert text in proc.stdout


@pytest.mark.slow
def test_minutes_budget_stops_training_when_the_time_is_up(tmp_path):
    run_dir = tmp_path / "run"
    proc = _make("experiment=sst2-bert-base", *TINY, "task=demo", "minutes=0.05", "trainer.max_steps=100000",
                 f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0 < summary["steps"] < 100000 and summary["train_seconds"] < 60
    assert summary["eval_samples"] == 101  # evaluated and exported as at a normal end
    assert (run_dir / "model" / "config.json").is_file()
    assert json.loads((run_dir / "reproduce.json").read_text())["budget"] == {"minutes": 0.05}


def test_budget_and_experiment_are_required():
    with pytest.raises(ConfigError, match="give a budget"):
        _budget(["experiment=sst2-bert-base"])
    with pytest.raises(ConfigError, match="steps=-3"):
        _budget(["steps=-3"])
    proc = _make("steps=5")
    assert proc.returncode != 0 and "error: 1 problem(s) in the config" in proc.stderr
    assert "name a paper recipe: experiment=" in proc.stderr
    assert proc.stderr.splitlines()[-1].endswith("reproduce] Error 2")  # make names the module's code: a config error's


def test_report_marks_a_metric_the_run_did_not_produce():
    cfg = compose_config("finetune", ["experiment=mnli-bert-base", "task.train_file=t.tsv",
                                      "task.validation_file=d.tsv"])
    summary = dict(eval={"accuracy": 0.5, "loss": 1.0}, steps=3, epochs=0.01, train_seconds=1.0, wall_seconds=2.0,
                   train_samples=96, precision="fp32", device_name="cpu", run_dir="/nonexistent")
    text, data = report(summary, cfg, compose_config("finetune", ["experiment=mnli-bert-base"]),
                        {"steps": 3}, "mnli-bert-base")
    rows = {r["metric"]: r for r in data["scores"]}
    assert rows["accuracy"]["run"] == 50.0 and rows["accuracy"]["gap"] == pytest.approx(50.0 - 84.6)
    assert rows["validation_mismatched/accuracy"]["run"] is None and "not reported" in text
    assert OmegaConf.to_container(cfg.published.scores) == {"accuracy": 84.6, "validation_mismatched/accuracy": 83.4}
    local = compose_config("finetune", ["experiment=mnli-bert-base", "task.train_file=t.tsv",
                                        "task.validation_file=d.tsv", "task.extra_validation_splits=[x/dev_mismatched.tsv]"])
    summary["eval"]["dev_mismatched/accuracy"] = 0.25
    _, data = report(summary, local, compose_config("finetune", ["experiment=mnli-bert-base"]), {"steps": 3},
                     "mnli-bert-base")
    assert {r["metric"]: r["run"] for r in data["scores"]} == {"accuracy": 50.0, "validation_mismatched/accuracy": 25.0}

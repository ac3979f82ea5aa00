"""A bare CUDA image: ampft imports, fine-tunes and runs the speed benchmark without the optional libraries
(scikit-learn, SciPy, matplotlib, TensorBoard), and a feature that needs one says which extra to install.
Also the version switches that differ between the image's torch and ours (recompile limit)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ampft.config import ConfigError
from ampft.extras import MissingExtraError, require
from ampft.tasks.classification import metrics
from tests.helpers import ROOT

# What the extras install: absent from the environment the subprocess below sees.
OPTIONAL = re.compile(r"^(scipy|sklearn|scikit_learn|matplotlib|mpl_toolkits|pylab|tensorboard|tensorboard_data_server)"
                      r"([-_.]|$)", re.IGNORECASE)

SCRIPT = r'''
import importlib.util, json, logging, site, sys
from pathlib import Path
site.addsitedir(OVERLAY)  # this interpreter's site-packages without the optional libraries
sys.path.insert(0, ROOT)
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
for name in ("scipy", "sklearn", "matplotlib", "tensorboard"):
    assert importlib.util.find_spec(name) is None, f"{name} is still importable"

import ampft.benchmark, ampft.finetune, ampft.evaluation.predictions, ampft.evaluation.saved, ampft.tasks  # noqa: E401
for recipe in sorted(Path(ROOT, "recipes").glob("*.py")):  # each recipe module's own imports
    spec = importlib.util.spec_from_file_location("recipe_" + recipe.stem, recipe)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
out = {"loaded": sorted(m for m in ("scipy", "sklearn", "matplotlib", "tensorboard") if m in sys.modules)}

from ampft.config import ConfigError
from ampft.tasks.classification import metrics
from ampft.extras import MissingExtraError
out["accuracy"] = metrics.compute(["accuracy"], [1, 0, 1, 1], [1, 1, 1, 1])["accuracy"]
def error(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except (MissingExtraError, ConfigError) as exc:
        return [type(exc).__name__, str(exc)]
    return None
out["f1"] = error(metrics.compute, ["f1"], [1, 0], [1, 1], num_labels=2)
out["pearson"] = error(metrics.compute, ["pearson"], [0.1, 0.5], [0.2, 0.4])
out["check"] = error(metrics.check_installed, ["accuracy", "f1"])
from ampft.benchmark import plots, stats
out["ci"] = error(stats.difference_ci, {1: 0.9, 2: 0.8}, {1: 0.85, 2: 0.8})
out["ci_one_seed"] = stats.difference_ci({1: 0.9}, {1: 0.85})["mean"]
out["plots"] = error(plots.make_plots, json.loads(Path(WORK, "results.json").read_text()), Path(WORK))
from ampft.tracking import log_with
out["log_with"] = log_with("tensorboard")

from ampft.finetune import run
from tests.helpers import TINY, compose_config
# Fine-tuning with a metric that needs no extra; the default demo metrics (accuracy, f1) stop before training.
summary = run(compose_config("finetune", [*TINY, "task.metrics=[accuracy]", "trainer.max_steps=4",
                                          "checkpoint.export=false"]), Path(WORK, "run"))
out["finetune_accuracy"] = summary["eval"]["accuracy"]
out["finetune_default"] = error(run, compose_config("finetune", TINY), Path(WORK, "run-default"))
out["finetune_default_trained"] = Path(WORK, "run-default", "metrics.jsonl").exists()

# The speed benchmark end to end (plots skipped, report written); accuracy mode refused before measuring.
from ampft.benchmark import run_benchmark
speed = compose_config("benchmark_recipe", [
    "benchmark.model=tiny-bert", "benchmark.seq_len=32", "benchmark.batch_size=8", "benchmark.modes=[speed]",
    "benchmark.speed.warmup_steps=1", "benchmark.speed.timed_steps=2",
    'benchmark.arms=[{name:fp32,overrides:["precision=fp32"]}]']).benchmark
report = run_benchmark(speed, Path(WORK, "bench"))
out["bench_files"] = sorted(p.name for p in Path(WORK, "bench").iterdir() if p.is_file())
out["bench_report_has_speed"] = "## Speed and memory" in report.read_text()
acc = compose_config("benchmark_recipe", ["benchmark.model=tiny-bert",
                                          'benchmark.arms=[{name:fp32,overrides:["precision=fp32"]}]']).benchmark
out["bench_accuracy"] = error(run_benchmark, acc, Path(WORK, "bench-acc"))
out["bench_accuracy_measured"] = Path(WORK, "bench-acc", "arms").exists()
print("RESULT " + json.dumps(out))
'''


@pytest.mark.slow
def test_bare_image_imports_finetunes_and_benchmarks_without_the_extras(tmp_path):
    from tests.benchmark.test_report import build_results

    purelib = Path(sysconfig.get_paths()["purelib"])
    overlay = tmp_path / "site-packages"  # named so: datasets pickles modules outside such paths by value
    overlay.mkdir()
    for entry in purelib.iterdir():
        if not OPTIONAL.match(entry.name):
            (overlay / entry.name).symlink_to(entry)
    (tmp_path / "results.json").write_text(json.dumps(build_results()))  # computed here, with SciPy
    script = (f"OVERLAY, ROOT, WORK = {str(overlay)!r}, {str(ROOT)!r}, {str(tmp_path)!r}\n"
              + textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])

    assert out["loaded"] == []
    assert out["accuracy"] == 0.75
    for key, name in (("f1", "'f1' metric"), ("pearson", "'pearson' metric"),
                      ("ci", "confidence intervals"), ("plots", "PNG plots")):
        kind, message = out[key]
        assert kind == "MissingExtraError" and name in message and "pip install 'ampft[" in message, key
    assert "ampft[metrics]" in out["f1"][1] and "ampft[plots]" in out["plots"][1]
    kind, message = out["check"]
    assert kind == "ConfigError" and "task.metrics=['accuracy', 'f1']" in message and "scikit-learn" in message
    assert out["ci_one_seed"] == pytest.approx(0.05)
    assert out["log_with"] is None
    assert "logging=tensorboard: the tensorboard package is not installed" in proc.stderr
    assert "pip install 'ampft[tensorboard]'" in proc.stderr and "logging=none" in proc.stderr

    assert 0.0 <= out["finetune_accuracy"] <= 1.0
    kind, message = out["finetune_default"]
    assert kind == "ConfigError" and "task.metrics" in message and "pip install 'ampft[metrics]'" in message
    assert not out["finetune_default_trained"]  # said before any training

    assert {"report.md", "results.json", "results.csv"} <= set(out["bench_files"])
    assert not any(f.endswith(".png") for f in out["bench_files"]) and out["bench_report_has_speed"]
    assert "no PNG plots (report.md has every number)" in proc.stderr
    kind, message = out["bench_accuracy"]
    assert kind == "BenchmarkConfigError" and "task.metrics" in message and "benchmark.accuracy.seeds" in message
    assert not out["bench_accuracy_measured"]


def test_missing_extra_error_names_the_feature_and_the_pip_command():
    with pytest.raises(MissingExtraError, match=r"the thing needs 'no_such_module_ampft'.*pip install "
                                                r"'ampft\[plots\]'.*pip install matplotlib"):
        require("no_such_module_ampft.sub", "plots", "the thing")
    assert require("json", "plots", "x") is json


def test_metric_check_before_training_names_the_key(monkeypatch):
    monkeypatch.setattr(metrics, "_lib", _sklearn_missing)
    metrics.check_installed(["accuracy", "seqeval", "squad"])  # need no extra
    with pytest.raises(ConfigError, match=r"task.metrics=\['accuracy', 'mcc'\]: the 'mcc' metric"):
        metrics.check_installed(["accuracy", "mcc"])


def test_numpy_accuracy_equals_scikit_learn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    refs, preds = rng.integers(0, 3, 257), rng.integers(0, 3, 257)
    assert metrics.accuracy_score(refs, preds) == sklearn_metrics.accuracy_score(refs, preds)
    assert metrics.compute(["accuracy"], list(preds), list(refs))["accuracy"] == pytest.approx(
        sklearn_metrics.accuracy_score(refs, preds), abs=0)


def test_tensorboard_missing_is_said_not_dropped_silently(monkeypatch, caplog, tiny, tmp_path):
    import accelerate.tracking

    from ampft.finetune import make_accelerator, reset_accelerate

    monkeypatch.setattr(accelerate.tracking, "_available_trackers", [])
    with caplog.at_level("WARNING", logger="ampft.tracking"):
        acc = make_accelerator(tiny("logging=tensorboard"), tmp_path)
    reset_accelerate()
    assert acc.log_with == []
    assert ("logging=tensorboard: the tensorboard package is not installed" in caplog.text
            and "pip install 'ampft[tensorboard]'" in caplog.text and "logging=none" in caplog.text)


def test_tensorboard_present_is_passed_on(caplog):
    import accelerate.tracking

    from ampft.tracking import log_with

    if "tensorboard" not in {str(t) for t in accelerate.tracking.get_available_trackers()}:
        pytest.skip("tensorboard not installed here")
    with caplog.at_level("WARNING", logger="ampft.tracking"):
        assert log_with("tensorboard") == "tensorboard" and log_with("none") is None
    assert caplog.text == ""


@pytest.mark.parametrize("names", [("recompile_limit", "cache_size_limit"), ("cache_size_limit",)])
def test_recompile_limit_under_either_name(names):
    """torch >= 2.6 calls it recompile_limit (cache_size_limit stays as an alias); torch 2.4/2.5 only knows
    cache_size_limit."""
    from ampft.finetune import raise_recompile_limit

    config = SimpleNamespace(**dict.fromkeys(names, 8))
    raise_recompile_limit(config, 20)
    assert getattr(config, names[0]) == 20
    if len(names) == 2:
        assert config.cache_size_limit == 8  # the legacy name is left alone where the new one exists
    raise_recompile_limit(config, 4)  # never lowered
    assert getattr(config, names[0]) == 20


def _sklearn_missing(metric):
    raise MissingExtraError(f"the {metric!r} metric (task.metrics) needs 'sklearn' ... pip install 'ampft[metrics]'")


def test_make_evaluate_names_the_missing_extra_before_loading(tiny, tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from ampft.evaluation.saved import EvaluationError, evaluate_saved
    from ampft.finetune import reset_accelerate, run

    run(tiny("trainer.max_steps=2"), tmp_path)  # demo: accuracy and f1
    monkeypatch.setattr(metrics, "_lib", _sklearn_missing)
    try:
        with pytest.raises(EvaluationError, match=r"config.yaml: task.metrics=\['accuracy', 'f1'\]: the 'f1' metric"
                                                  r".*pip install 'ampft\[metrics\]'"):
            evaluate_saved(OmegaConf.create(dict(run=str(tmp_path), checkpoint=None, split="validation", file=None,
                                                 precision=None, batch_size=64, name=None)))
    finally:
        reset_accelerate()
    assert not (tmp_path / "eval_validation.json").exists()

"""One error hierarchy (ampft.errors), one wrapper: each error ends a real recipe run with its exit code.

ConfigError, DataError, ModelLoadError and Preempted are run through recipes/finetune.py elsewhere
(tests/e2e/test_cli.py::test_cross_field_problems_reported_together_before_building,
tests/data/test_bad_inputs.py::test_shifted_tsv_never_trains_end_to_end,
tests/e2e/test_cli.py::test_hub_model_offline_fails_fast_with_guidance, tests/checkpointing/test_resume.py: exit 75);
the others are here. MissingExtraError is turned into a ConfigError before training
(tests/package/test_optional_imports.py); the wrapper test covers its code.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch

from ampft import errors
from tests.helpers import ROOT, TINY

# Every error class, the module it has always been imported from, and its exit code.
TABLE = [
    ("ConfigError", "ampft.config", 2),
    ("BenchmarkConfigError", "ampft.benchmark", 2),
    ("DataError", "ampft.data", 2),
    ("ModelLoadError", "ampft.models", 2),
    ("CheckpointError", "ampft.checkpointing", 2),
    ("EvaluationError", "ampft.evaluation.saved", 2),
    ("MissingExtraError", "ampft.extras", 2),
    ("TrainingDiverged", "ampft.engine", 3),
    ("Preempted", "ampft.engine", 75),
]


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", **env}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.mark.parametrize("name,module,code", TABLE)
def test_every_error_has_one_base_its_code_and_its_old_import(name, module, code):
    cls = getattr(errors, name)
    assert issubclass(cls, errors.AmpftError) and cls.exit_code == code
    assert getattr(importlib.import_module(module), name) is cls


@pytest.mark.parametrize("name,module,code", TABLE)
def test_the_wrapper_reports_the_message_and_exits_with_the_code(name, module, code, capsys):
    cls = getattr(errors, name)

    @errors.exit_on_error
    def main(x):
        raise cls(["task.x=1: must be 2"]) if issubclass(cls, errors.ConfigError) else cls(f"boom {x}")

    with pytest.raises(SystemExit) as exit_:
        main(7)
    assert exit_.value.code == code
    said = capsys.readouterr().err
    assert said.startswith("preempted: " if name == "Preempted" else "error: ") and "Traceback" not in said
    assert ("task.x=1: must be 2" if issubclass(cls, errors.ConfigError) else "boom 7") in said
    assert errors.exit_on_error(lambda: 5)() == 5  # a normal return passes through


def test_ctrl_c_outside_training_ends_with_one_line_and_130(capsys):
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exit_:
        errors.exit_on_error(interrupted)()
    assert exit_.value.code == 130 and capsys.readouterr().err == "interrupted (Ctrl-C)\n"


def test_the_table_covers_every_error_class():
    defined = {n for n, c in vars(errors).items() if isinstance(c, type) and issubclass(c, errors.AmpftError)}
    assert defined - {"AmpftError"} == {name for name, _, _ in TABLE}


def test_recipe_names_shadow_no_library():
    """`python recipes/X.py` puts recipes/ first on sys.path: no recipe may be named like an importable module."""
    for recipe in sorted((ROOT / "recipes").glob("*.py")):
        assert importlib.util.find_spec(recipe.stem) is None, f"recipes/{recipe.name} shadows a module"


def test_diverged_run_exits_3(tmp_path):
    proc = _run(["recipes/finetune.py", *TINY, "optim.lr=1e4", "trainer.max_steps=40", "trainer.log_every=2",
                 "precision.max_consecutive_nonfinite=2", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    # On a line of its own: the progress bar is closed before the error is said.
    assert any(line.startswith("error: training diverged at step") for line in proc.stderr.splitlines())
    assert not (tmp_path / "summary.json").exists()


def test_checkpoint_error_exits_2(tmp_path):
    fake = tmp_path / "elsewhere" / "step_4"
    fake.mkdir(parents=True)
    proc = _run(["recipes/finetune.py", *TINY, "trainer.max_steps=4", f"checkpoint.resume={fake}",
                 f"hydra.run.dir={tmp_path / 'run'}"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: checkpoint.resume={fake} cannot be loaded: no manifest.json" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_evaluation_error_exits_2(tmp_path):
    proc = _run(["recipes/eval.py", f"run={tmp_path}"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: run={tmp_path}: no exported model" in proc.stderr


def test_benchmark_config_error_exits_2(tmp_path):
    proc = _run(["recipes/benchmark.py", "benchmark.seq_len=4", "benchmark.batch_size=0", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "problem(s) in the benchmark config" in proc.stderr
    assert "benchmark.seq_len=4" in proc.stderr and "benchmark.batch_size=0" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the refusal on a machine without a GPU")
def test_a_gpus_benchmark_without_a_gpu_is_refused_before_measuring(tmp_path):
    proc = subprocess.run(["make", "--no-print-directory", "benchmark-gpu", f"hydra.run.dir={tmp_path / 'run'}",
                           f"PYTHON={sys.executable}"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "benchmark=bert-large-seq384 measures a GPU and this machine has none" in proc.stderr
    assert not (tmp_path / "run" / "results.json").exists() and "speed mode" not in proc.stderr


def test_comparison_config_error_exits_2(tmp_path):
    proc = _run(["recipes/benchmark.py", "benchmark=peer-sst2-minilm", "benchmark.accuracy.seeds=[]",
                 f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "benchmark.accuracy.seeds is empty" in proc.stderr


def test_launcher_config_error_exits_2(tmp_path):
    proc = _run(["-m", "ampft.launch", *TINY, "trainer.batch_size=0", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "error: 1 problem(s) in the config" in proc.stderr and "trainer.batch_size=0" in proc.stderr


# Compose errors: Hydra reports them itself and exits 1; every recipe (ampft.errors.compose_errors) and the
# launcher make them a ConfigError, one line, exit 2. The messages of each kind: tests/config/test_compose.py.
COMPOSE_ERRORS = [
    (["recipes/finetune.py", "trainer.max_step=20"], "trainer.max_step: no such key; did you mean trainer.max_steps"),
    (["recipes/finetune.py", "+trainer.max_step=3"], "+trainer.max_step=3: trainer.max_step is no key of the config"),
    (["-m", "ampft.launch", "trainer.max_step=20"], "trainer.max_step: no such key; did you mean trainer.max_steps"),
    (["-m", "ampft.launch", "+precison=bf16"], "+precison=bf16: precison is no key of the config"),
    (["recipes/eval.py", "+fil=x.csv"], "+fil=x.csv: fil is no key of the config, nothing would read it; did you "
                                        "mean file?"),
    (["recipes/predict.py", "+fil=x.csv"], "+fil=x.csv: fil is no key of the config, nothing would read it; did you "
                                           "mean file?"),
    (["recipes/estimate.py", "precision=fp8"], "precision=fp8: no such option in conf/precision/; choose one of bf16, "
                                               "fp16, fp32, tf32"),
    (["recipes/estimate.py", "trainer.max_steps=abc"], "trainer.max_steps: Value 'abc' of type 'str' could not be "
                                                       "converted to Integer"),
    (["recipes/benchmark.py", "benchmark=nope"], "benchmark=nope: no such option in conf/benchmark/; choose one of"),
    (["recipes/benchmark.py", "+benchmark.sedes=[1]"], "+benchmark.sedes=[1]: benchmark.sedes is no key of the config"),
]


@pytest.mark.parametrize(("args", "said"), COMPOSE_ERRORS, ids=lambda a: " ".join(a) if isinstance(a, list) else "")
def test_a_config_hydra_cannot_compose_or_nothing_reads_exits_2_with_one_line(tmp_path, args, said):
    proc = _run([*args, f"hydra.run.dir={tmp_path}", f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: 1 problem(s) in the config: {said}" in proc.stderr
    assert "Traceback" not in proc.stderr and len([x for x in proc.stderr.splitlines() if "error" in x]) == 1
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "0" / "summary.json").exists()


def test_a_key_the_schema_leaves_open_still_trains(tmp_path):
    proc = _run(["recipes/finetune.py", *TINY, "trainer.max_steps=2", "+model.arch.hidden_dropout_prob=0.0",
                 f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hidden_dropout_prob: 0.0" in (tmp_path / "config.yaml").read_text()


# Through make: GNU make ends every failed command with its own code 2 (it cannot pass a command's code on) and
# names the command's in its last line; what make runs (the launcher, the recipes) keeps the table's codes.
DIVERGES = [*TINY, "optim.lr=1e4", "trainer.max_steps=40", "trainer.log_every=2", "precision.max_consecutive_nonfinite=2"]


def test_make_exits_2_and_names_the_recipes_code_which_the_launcher_keeps(tmp_path):
    """make runs `python -m ampft.launch`, which ran the recipe: make's "Error 3" is the launcher's own code."""
    made = _run_make(["finetune", *DIVERGES, f"hydra.run.dir={tmp_path}"])
    assert made.returncode == 2, made.stderr[-3000:]
    assert "error: training diverged" in made.stderr and "finetune] Error 3" in made.stderr.splitlines()[-1]


@pytest.mark.parametrize("target", ["finetune", "print-config", "estimate", "reproduce", "evaluate", "benchmark",
                                    "benchmark-peer"])
def test_every_make_target_reports_a_compose_error_in_one_line(tmp_path, target):
    key = {"evaluate": "fil", "benchmark": "benchmark.seq_le", "benchmark-peer": "benchmark.accuracy.sedes"}.get(target, "trainer.max_step")
    extra = ["experiment=sst2-bert-base", "steps=2"] if target == "reproduce" else []
    made = _run_make([target, *extra, f"{key}=1", f"hydra.run.dir={tmp_path}"])
    assert made.returncode == 2, made.stderr[-3000:]
    errors = [x for x in made.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and f"error: 1 problem(s) in the config: {key}: no such key" in errors[0], made.stderr
    assert "Traceback" not in made.stderr and made.stderr.splitlines()[-1].endswith("Error 2")


def _run_make(args: list[str]) -> subprocess.CompletedProcess:
    return _run_cmd(["make", "--no-print-directory", *args, f"PYTHON={sys.executable}"])


def _run_cmd(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.mark.distributed
def test_several_processes_exit_with_the_ranks_code(tmp_path):
    """`accelerate launch` turns a rank's code into 1; `python -m ampft.launch` (make finetune) keeps it."""
    proc = _run(["-m", "ampft.launch", *DIVERGES, "distributed=ddp", "distributed.num_processes=2",
                 f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "error: training diverged" in proc.stderr
    ended = next(x for x in proc.stderr.splitlines() if x.startswith("ranks ended with: "))
    # In the order they ended: the first with its code; torch's launcher stops a rank still tearing down once
    # another failed (SIGTERM, -15), which on a loaded machine can be the second.
    codes = re.findall(r"rank (\d): (-?\d+)", ended)
    assert sorted(r for r, _ in codes) == ["0", "1"] and codes[0][1] == "3", ended
    assert all(c in ("3", "-15") for _, c in codes[1:]), ended
    assert "Traceback" not in proc.stderr


@pytest.mark.distributed
def test_several_processes_a_data_error_is_one_line_from_the_main_process(tmp_path):
    """The main process reads and tokenizes the data first while the other ranks wait: a file it refuses ends every
    rank, with the main process's one error line (the others waited at a barrier it never reached and ended in a
    traceback of the lost connection)."""
    (tmp_path / "train.csv").write_text("text,label\ngood stuff,1\nbad stuff,0\n")
    proc = _run(["-m", "ampft.launch", *TINY, "task=csv", f"task.train_file={tmp_path / 'train.csv'}",
                 f"task.validation_file={tmp_path / 'train.csv'}", "task.text_fields=[sentence]",
                 "trainer.max_steps=2", "distributed=ddp", "distributed.num_processes=2",
                 f"hydra.run.dir={tmp_path / 'run'}"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and "column(s) ['sentence'] not in the train split" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.distributed
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR1"])
def test_several_processes_preempted_by_a_signal_to_the_launcher_exit_75(tmp_path, sig):
    """SIGTERM or SIGUSR1 to the launcher (what a scheduler sends): torch's launcher passes it to the ranks (SIGUSR1
    only when told to: ampft tells it), they checkpoint and exit 75, and the launcher, stopped by the signal, exits
    75 too (accelerate launch: 128 + the signal)."""
    import json
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "ampft.launch", *TINY, "trainer.max_steps=400", "trainer.log_every=2",
                             "distributed=ddp", "distributed.num_processes=2", f"hydra.run.dir={tmp_path}"],
                            cwd=ROOT, env={**os.environ, "HYDRA_FULL_ERROR": "0"}, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "metrics.jsonl"
    while not (metrics.is_file() and any(json.loads(x)["event"] == "train" for x in metrics.read_text().splitlines())):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.1)
    proc.send_signal(getattr(signal, sig))
    _, stderr = proc.communicate()
    assert proc.returncode == 75, stderr[-3000:]
    assert (tmp_path / "PREEMPTED").is_file() and list((tmp_path / "checkpoints").glob("step_*"))

"""The default tracker (TensorBoard) takes the run's config as hparams: nested keys flattened by
`config.flat`, values it cannot hold (lists, None) as their text."""

from __future__ import annotations

import pytest
import yaml

from ampft.config import flat, to_plain
from ampft.finetune import run


def test_tensorboard_run_records_the_flattened_config(tiny, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny("trainer.max_steps=2", "checkpoint.export=false")
    run(cfg, tmp_path)
    events = sorted((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    assert acc.Scalars("train/loss")  # the run logged to the tracker
    (saved,) = (tmp_path / "tensorboard").rglob("hparams.yml")  # what Accelerate gave TensorBoard
    hparams = yaml.safe_load(saved.read_text())
    assert hparams["trainer.batch_size"] == 16 and hparams["optim.lr"] == 1e-3  # numbers stay numbers
    assert hparams["optim.betas"] == "[0.9, 0.999]" and hparams["trainer.max_minutes"] == "None"  # the rest: text
    assert flat(to_plain(cfg))["optim.betas"] == [0.9, 0.999]  # flat itself keeps values as they are


@pytest.mark.parametrize("logger", ["wandb", "mlflow"])
def test_wandb_and_mlflow_offline_log_the_run_inside_its_run_dir(tiny, tmp_path, monkeypatch, logger):
    """logging=wandb with WANDB_MODE=offline (no account, no network) and logging=mlflow with no tracking server:
    the metrics are recorded, and every file lands in the run dir (nothing in the working directory)."""
    pytest.importorskip(logger)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("WANDB_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    run_dir = tmp_path / "run"
    run(tiny(f"logging={logger}", "trainer.max_steps=4", "trainer.log_every=2", "checkpoint.export=false"), run_dir)
    assert list(cwd.iterdir()) == []
    if logger == "wandb":
        (offline,) = (run_dir / "wandb").glob("offline-run-*")
        assert list(offline.glob("run-*.wandb"))  # what `wandb sync` uploads later
    else:
        import mlflow

        mlflow.set_tracking_uri(f"sqlite:///{run_dir / 'mlflow.db'}")
        runs = mlflow.search_runs(search_all_experiments=True)
        assert len(runs) == 1 and runs["metrics.train/loss"].notna().all()
        assert runs["params.trainer.batch_size"][0] == "16"


@pytest.mark.parametrize("project", ["../../elsewhere", "/tmp/ampft-tensorboard", "tb/../../x"])
def test_tensorboard_files_never_go_outside_the_run_dir(tiny, project):
    from ampft.config import ConfigError
    from ampft.validation import validate

    with pytest.raises(ConfigError) as err:
        validate(tiny(f"logging.project={project}"))
    (problem,) = [p for p in err.value.problems if p.startswith("logging.project=")]
    assert problem.startswith(f"logging.project={project}: under logging=tensorboard") and "without '..'" in problem
    validate(tiny("logging.project=tb/this-run"))  # a folder inside the run dir is fine
    validate(tiny("logging=wandb", "logging.project=../a"))  # a W&B project is a name, not a folder

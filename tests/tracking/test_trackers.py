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
    assert cfg.logging.name == "tensorboard"  # the default
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

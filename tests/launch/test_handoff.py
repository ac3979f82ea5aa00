"""Compose once: `python -m ampft.launch` (make finetune) composes and validates the config and hands it to the
recipe in `$AMPFT_LAUNCHED`; the recipe started with those arguments runs it as Hydra would run its own
composition (run dir, `.hydra/`, logging), without composing or validating it again. Started otherwise, the
recipe composes itself."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import hydra
import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from ampft import launch, validation
from ampft.config import Precision, to_plain
from tests.helpers import ROOT, TINY


@pytest.fixture
def logging_kept():
    """run_launched configures logging as Hydra's job does; the test process gets its own back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.setLevel(level)


def test_the_recipe_runs_the_launchers_config_without_composing_it(tmp_path, monkeypatch, logging_kept):
    argv = [*TINY, "precision=bf16", f"hydra.run.dir={tmp_path}"]
    composed = launch.compose(argv, with_hydra=True)
    monkeypatch.setenv(launch.HANDOFF, launch.handoff(composed, argv))
    monkeypatch.setattr(sys, "argv", ["recipes/finetune.py", *argv])

    def refuse(*args, **kwargs):
        raise AssertionError("composed again")

    monkeypatch.setattr(hydra, "compose", refuse)
    monkeypatch.setattr(launch, "compose", refuse)
    seen = {}

    def job(cfg):
        seen.update(cfg=cfg, run_dir=HydraConfig.get().runtime.output_dir)
        logging.getLogger("ampft.test").info("from the job")

    assert launch.run_launched(job)
    cfg = seen["cfg"]
    assert to_plain(cfg) == to_plain(launch.without_hydra(composed))  # the very config the launcher validated
    assert cfg.precision.name is Precision.bf16 and OmegaConf.is_struct(cfg)  # typed as composed
    assert seen["run_dir"] == str(tmp_path)
    assert OmegaConf.load(tmp_path / ".hydra" / "overrides.yaml") == argv[:-1]  # Hydra's record, as by hand
    assert "from the job" in (tmp_path / "finetune.log").read_text()  # Hydra's job logging
    assert launch.HANDOFF not in os.environ  # taken: nothing this process starts sees it


def test_a_recipe_started_with_other_arguments_composes_itself(tmp_path, monkeypatch):
    argv = [*TINY, f"hydra.run.dir={tmp_path}"]
    monkeypatch.setenv(launch.HANDOFF, launch.handoff(launch.compose(argv, with_hydra=True), argv))
    monkeypatch.setattr(sys, "argv", ["recipes/finetune.py", *argv[:-1], "trainer.max_steps=1", argv[-1]])
    assert not launch.run_launched(lambda cfg: pytest.fail("ran the handed config"))
    assert launch.HANDOFF not in os.environ and not (tmp_path / ".hydra").exists()


@pytest.mark.slow
def test_make_finetune_validates_once(tmp_path):
    """A validation warning is said once, by the launcher, not again by the recipe it started."""
    said = "without checkpoint.export_best=true"
    overrides = [*TINY, "trainer.max_steps=3", "trainer.eval_every=1", "trainer.early_stopping_patience=1"]
    assert any(said in w for w in validation.validate(launch.compose(overrides)))
    proc = subprocess.run([sys.executable, "-m", "ampft.launch", *overrides, f"hydra.run.dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (proc.stdout + proc.stderr).count(said) == 1
    assert (tmp_path / "summary.json").is_file()


def test_hydra_flags_from_make_args_reach_the_recipe_in_an_order_hydra_parses(monkeypatch):
    """`make finetune model=tiny-bert ARGS="-m precision=fp32,bf16"` puts the ARGS words last: the launcher hands
    the recipe its overrides before the flags, or Hydra's parser would reject `precision=fp32,bf16`."""
    from hydra._internal.utils import get_args_parser

    execed = []

    def execv(path, argv):  # replaces the process: nothing after it runs
        execed.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    with pytest.raises(SystemExit):
        launch.main(["model=tiny-bert", "trainer.max_steps=2", "-m", "precision=fp32,bf16", "--config-name",
                     "finetune"])
    argv = execed[0][2:]
    assert execed[0][1] == launch.RECIPE
    args = get_args_parser().parse_args(argv)  # argparse exits on an argument it cannot place
    assert args.multirun and args.config_name == "finetune"
    assert args.overrides == ["model=tiny-bert", "trainer.max_steps=2", "precision=fp32,bf16"]

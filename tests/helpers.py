"""Shared test helpers: paths, the tiny-run overrides, config composition, real-data lookup. Tests import these
from here (`from tests.helpers import ...`); tests/conftest.py holds only fixtures."""

from __future__ import annotations

import os
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
    """A primary config from conf/ (finetune, benchmark_recipe, peer_recipe) composed as its recipe composes
    it, without Hydra's runtime. The recipes' schemas are registered on import of their modules."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import ampft.benchmark.config  # noqa: F401  (registers benchmark_recipe)
    import ampft.benchmark.peer  # noqa: F401  (registers peer_recipe)
    import ampft.config  # noqa: F401  (registers finetune_schema)

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides or []), **kwargs)


def shared(*parts: str) -> Path:
    """A file or folder of the real data (../shared/data, or $AMPFT_SHARED_DATA); skips the test when absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real data not present: {path}")
    return path


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

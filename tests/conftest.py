"""Shared fixtures: real configs composed from conf/, shrunk to run in seconds on a CPU, no network."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# No test may reach the Hub; set before transformers/datasets are imported anywhere.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SHARED_DATA = Path(os.environ.get("AMPFT_SHARED_DATA", ROOT.parent / "shared" / "data"))

# A fast, real run: tiny BERT, short sequences, a few dozen steps, no trackers, no progress bar.
TINY = [
    "model=tiny-bert",
    "logging=none",
    "trainer.progress_bar=false",
    "trainer.batch_size=16",
    "trainer.log_every=5",
    "optim.lr=1e-3",
    "task.max_train_samples=640",
    "task.max_eval_samples=101",
]


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory):
    os.environ["AMPFT_CACHE"] = str(tmp_path_factory.mktemp("ampft-cache"))


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


@pytest.fixture
def compose():
    """compose(["precision=bf16", ...]) → the same config the recipe gets (without Hydra's runtime)."""
    return lambda overrides=None: compose_config("finetune", overrides)


@pytest.fixture
def tiny(compose):
    return lambda *overrides: compose([*TINY, *overrides])


def shared(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real data not present: {path}")
    return path

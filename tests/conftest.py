"""Shared fixtures: real configs composed from conf/, shrunk to run in seconds on a CPU, no network. Plain
helpers (ROOT, CONF, TINY, compose_config, shared, ...) live in tests/helpers.py."""

from __future__ import annotations

import os

# No test may reach the Hub; set before transformers/datasets are imported anywhere.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (`make test` runs a worker per core), each worker and the processes it starts get their
# share of the cores: two workers of two torch threads each on two cores ran the training tests 3x slower.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

import random  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tests.helpers import TINY, compose_config, family_files, family_run_overrides  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory):
    os.environ["AMPFT_CACHE"] = str(tmp_path_factory.mktemp("ampft-cache"))


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same global random state, whichever tests ran before it in its process:
    pytest-xdist deals tests to workers in no fixed order."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture
def compose():
    """compose(["precision=bf16", ...]) → the same config the recipe gets (without Hydra's runtime)."""
    return lambda overrides=None: compose_config("finetune", overrides)


@pytest.fixture
def tiny(compose):
    return lambda *overrides: compose([*TINY, *overrides])


@pytest.fixture(scope="session")
def family_run(tmp_path_factory):
    """family_run(kind) -> the run dir of a tiny run of that kind (`family_run_overrides`: sst2 with a checkpoint
    at step 6, rte, stsb, ner, squad, squad_v2), trained for real once per test process, on demand. Tests may
    add their own evaluations/ and predictions/ to it, nothing else: copy it to damage it."""
    from ampft.finetune import reset_accelerate, run

    files, done = None, {}

    def get(kind: str):
        nonlocal files
        if kind not in done:
            files = files or family_files(tmp_path_factory.mktemp("family-files"))
            run_dir = tmp_path_factory.mktemp(f"run-{kind}")
            extra = ["checkpoint.every=6"] if kind == "sst2" else []
            run(compose_config("finetune", [*family_run_overrides(kind, files), *extra]), run_dir)
            reset_accelerate()
            done[kind] = run_dir
        return done[kind]

    return get

"""Benchmark configs composed from conf/ the way recipes/benchmark.py composes them."""

from __future__ import annotations

import pytest

from tests.conftest import CONF


@pytest.fixture
def compose_benchmark():
    from hydra import compose, initialize_config_dir

    import ampft.benchmark.config  # noqa: F401  (registers benchmark_recipe)

    def _compose(overrides: list[str] | None = None):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(config_name="benchmark_recipe", overrides=list(overrides or []))

    return _compose

"""Benchmark configs composed from conf/ the way recipes/benchmark.py composes them."""

from __future__ import annotations

import pytest

from tests.helpers import compose_config


@pytest.fixture
def compose_benchmark():
    return lambda overrides=None: compose_config("benchmark_recipe", overrides)

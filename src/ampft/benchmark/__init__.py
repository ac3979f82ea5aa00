"""The benchmark (`make benchmark`, `-gpu`, `-peer`): arms × modes (speed/memory, accuracy over seeds), one
schema (`config`), one orchestration (`runner`), one results module and one report writer; the layout is in
docs/architecture.md and what each mode measures in docs/benchmarks/README.md.

Entry point: `run_benchmark(cfg.benchmark, out_dir)` (recipes/benchmark.py, under Hydra).
"""

from ampft.benchmark.config import BenchmarkConfigError, check
from ampft.benchmark.report import rerender, write_outputs
from ampft.benchmark.runner import run_benchmark

__all__ = ["BenchmarkConfigError", "check", "rerender", "run_benchmark", "write_outputs"]

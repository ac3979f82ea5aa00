"""The benchmark (`make benchmark`, `make benchmark-gpu`, `make benchmark-peer`): arms × modes, one schema, one
results module, one report writer.

- speed/memory mode (`speed`): timed optimizer steps on synthetic batches → step time, samples/s, tokens/s,
  TFLOP/s, MFU (`flops`), peak memory, and peak memory versus batch size;
- accuracy mode (`accuracy`): full fine-tuning runs per arm and seed → metric mean/std and the difference to
  the baseline with a confidence interval (`stats`), loss curves, fp16 loss-scale traces, speeds over seeds.
  An arm's runner is ampft or a run_glue-style Trainer script (`trainer`), so a comparison with the Trainer
  is a benchmark too: its targets, accuracy checks and each side's gain from a precision are in the report;
  `combine` merges seeds measured in separate runs, `profile` says where a step's time goes;
- `budget` keeps a run within `benchmark.budget_minutes`; `results` turns measurements into statistics and
  verdicts, `report` and `plots` write them (`write_outputs`; `rerender` from a saved results.json).

Entry point: `run_benchmark(cfg.benchmark, out_dir)` (recipes/benchmark.py, under Hydra).
"""

from ampft.benchmark.config import BenchmarkConfigError, check
from ampft.benchmark.report import rerender, write_outputs
from ampft.benchmark.runner import run_benchmark

__all__ = ["BenchmarkConfigError", "check", "rerender", "run_benchmark", "write_outputs"]

"""The precision A/B benchmark: arms (precision, attention, batch size) over the same model, task, batch,
sequence length, seed and data order.

- speed/memory mode (`speed`): timed optimizer steps on synthetic batches → step time, samples/s, tokens/s,
  TFLOP/s, MFU (`flops`), peak memory, and peak memory versus batch size;
- accuracy mode (`accuracy`): full fine-tuning runs per arm and seed → metric mean/std and the difference
  to the baseline with a confidence interval (`stats`), loss curves, fp16 loss-scale traces;
- `results` turns measurements into statistics and claim verdicts, `report` and `plots` write them.

Entry point: `run_benchmark(cfg.benchmark, out_dir)`; `recipes/benchmark.py` calls it under Hydra.
"""

from ampft.benchmark.config import BenchmarkConfigError, check
from ampft.benchmark.runner import run_benchmark, write_outputs

__all__ = ["BenchmarkConfigError", "check", "run_benchmark", "write_outputs"]

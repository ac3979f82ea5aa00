"""The benchmarks: the precision A/B benchmark (`make benchmark`) and the comparison with the Hugging Face Trainer
(`make benchmark-peer`), one schema module, one results module, one report writer.

- speed/memory mode (`speed`): timed optimizer steps on synthetic batches → step time, samples/s, tokens/s,
  TFLOP/s, MFU (`flops`), peak memory, and peak memory versus batch size;
- accuracy mode (`accuracy`): full fine-tuning runs per arm and seed → metric mean/std and the difference
  to the baseline with a confidence interval (`stats`), loss curves, fp16 loss-scale traces;
- the comparison (`peer`): each arm (a `Runner`, ampft or a run_glue-style Trainer script in `trainer`, plus
  finetune overrides) × seed in its own process; `combine` merges seeds measured in separate runs, `profile`
  (`peer.profile_steps`) says where a step's time goes;
- `results` turns measurements into statistics and verdicts, `report` and `plots` write them
  (`write_outputs`; `rerender` from a saved results.json).

Entry points: `run_benchmark(cfg.benchmark, out_dir)` (recipes/benchmark.py) and `peer.run_peer(cfg.peer,
out_dir)` (recipes/peer.py), each called under Hydra.
"""

from ampft.benchmark.config import BenchmarkConfigError, check
from ampft.benchmark.report import rerender, write_outputs
from ampft.benchmark.runner import run_benchmark

__all__ = ["BenchmarkConfigError", "check", "rerender", "run_benchmark", "write_outputs"]

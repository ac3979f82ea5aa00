"""The precision A/B benchmark: `python recipes/benchmark.py [benchmark=NAME] [benchmark.key=value] ...`.

    python recipes/benchmark.py                                  # benchmark=cpu-smoke: MiniLM-L6 on CPU
    python recipes/benchmark.py benchmark=bert-large-seq384      # the GPU table (make benchmark-gpu)
    python recipes/benchmark.py benchmark.modes=[speed] benchmark.speed.timed_steps=50

Configs live in conf/benchmark/; each arm is a list of ordinary finetune overrides. Everything is written
into the run directory (runs/benchmark/<name>/<time>/): report.md, results.json, results.csv, PNG plots.
"""

import sys
from pathlib import Path

# Run as a script, recipes/ is sys.path[0]: a recipe named like a library (evaluate.py) would shadow it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import ampft.benchmark.config  # noqa: E402, F401  (registers the benchmark schema before composition)


@hydra.main(version_base="1.3", config_path="../conf", config_name="benchmark_recipe")
def main(cfg: DictConfig) -> None:
    from ampft.benchmark import BenchmarkConfigError, run_benchmark
    from ampft.config import ConfigError
    from ampft.data import DataError
    from ampft.models import ModelLoadError

    overrides = " ".join(HydraConfig.get().overrides.task)
    command = f"python recipes/benchmark.py {overrides}".strip()
    try:
        path = run_benchmark(cfg.benchmark, HydraConfig.get().runtime.output_dir, command=command)
    except (BenchmarkConfigError, ConfigError, DataError, ModelLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(f"report: {path}", flush=True)


if __name__ == "__main__":
    main()

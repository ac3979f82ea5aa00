"""The precision A/B benchmark: `python recipes/benchmark.py [benchmark=NAME] [benchmark.key=value] ...`.

    python recipes/benchmark.py                                  # benchmark=cpu-smoke: MiniLM-L6 on CPU
    python recipes/benchmark.py benchmark=bert-large-seq384      # the GPU table (make benchmark-gpu)
    python recipes/benchmark.py benchmark.modes=[speed] benchmark.speed.timed_steps=50

Configs live in conf/benchmark/; each arm is a list of ordinary finetune overrides. Everything is written
into the run directory (runs/benchmark/<name>/<time>/): report.md, results.json, results.csv, PNG plots.
"""

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ampft.benchmark.config  # noqa: F401  (registers the benchmark schema before composition)
from ampft.errors import compose_errors, exit_on_error


@compose_errors
@hydra.main(version_base="1.3", config_path="../conf", config_name="benchmark_recipe")
@exit_on_error
def main(cfg: DictConfig) -> None:
    from ampft.benchmark import run_benchmark

    overrides = " ".join(HydraConfig.get().overrides.task)
    command = f"python recipes/benchmark.py {overrides}".strip()
    path = run_benchmark(cfg.benchmark, HydraConfig.get().runtime.output_dir, command=command)
    print(f"report: {path}", flush=True)


if __name__ == "__main__":
    main()

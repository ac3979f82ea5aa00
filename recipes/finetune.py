"""Fine-tune a Transformer: `python recipes/finetune.py [group=option] [key=value] ...`.

    python recipes/finetune.py                                   # offline default: MiniLM-L6 on `demo`
    python recipes/finetune.py model=bert-large precision=bf16   # any config group
    python recipes/finetune.py -m precision=fp32,bf16            # one run directory per job

Started by `python -m ampft.launch` (`make finetune`), it runs the config the launcher composed and validated
(`ampft.launch.run_launched`); started any other way, Hydra composes it here and `finetune.build` validates it.
"""

import time

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ampft.config  # noqa: F401  (registers the structured schema before composition)
from ampft.errors import compose_errors, exit_on_error

STARTED: float | None = time.perf_counter()  # the first job's wall time counts the imports; later jobs of a
# multirun (-m) start at their own start


def train(cfg: DictConfig, validated: bool = False) -> float:
    """The run's main metric: what a sweeper (hydra/sweeper=optuna) optimises. `validated`: the launcher
    validated `cfg` already."""
    global STARTED
    started, STARTED = STARTED, None
    from ampft.finetune import run
    from ampft.tracking import clean_console

    with clean_console():
        summary = run(cfg, HydraConfig.get().runtime.output_dir, started=started, validated=validated)
    return summary["eval"][cfg.task.main_metric]


@compose_errors
@hydra.main(version_base="1.3", config_path="../conf", config_name="finetune")
@exit_on_error
def main(cfg: DictConfig) -> float:
    return train(cfg)


if __name__ == "__main__":
    from ampft.launch import run_launched

    if not run_launched(lambda cfg: train(cfg, validated=True)):
        main()

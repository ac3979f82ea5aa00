"""Predict memory and step time of a fine-tuning recipe per precision on a named GPU, without running it
(`make estimate`; usage: conf/estimate.yaml). Writes estimate.json and estimate.md into the run directory
(runs/estimate/<model>-<gpu>/<time>/)."""

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ampft.estimate.config  # noqa: F401  (registers estimate_schema and, through ampft.config, finetune_schema)
from ampft.errors import compose_errors, exit_on_error


@compose_errors
@hydra.main(version_base="1.3", config_path="../conf", config_name="estimate")
@exit_on_error
def main(cfg: DictConfig) -> None:
    from ampft.estimate import report
    from ampft.estimate.run import estimate

    command = "make estimate " + " ".join(HydraConfig.get().overrides.task)
    result = estimate(cfg, command=command.strip())
    path = report.write(result, Path(HydraConfig.get().runtime.output_dir))
    print(report.console(result))
    print(f"report: {path}", flush=True)


if __name__ == "__main__":
    main()

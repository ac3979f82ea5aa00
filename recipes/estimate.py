"""Predict memory and step time of a fine-tuning recipe per precision on a named GPU, without running it.

    python recipes/estimate.py model=bert-large precision=bf16 trainer.batch_size=32 task.max_length=384 \
        estimate.gpu=a100-80gb
    python recipes/estimate.py distributed=fsdp distributed.num_processes=8 estimate.gpu=h100-sxm

Any finetune group or key composes as for recipes/finetune.py; the estimate.* keys: src/ampft/estimate/config.py.
Writes estimate.json and estimate.md into the run directory (runs/estimate/<model>-<gpu>/<time>/).
"""

import sys
from pathlib import Path

# Run as a script, recipes/ is sys.path[0]: a recipe named like a library module would shadow it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import ampft.config  # noqa: E402, F401  (registers finetune_schema)
import ampft.estimate.config  # noqa: E402, F401  (registers estimate_schema)
from ampft.errors import compose_errors, exit_on_error  # noqa: E402


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

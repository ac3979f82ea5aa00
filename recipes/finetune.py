"""Fine-tune a Transformer: `python recipes/finetune.py [group=option] [key=value] ...`.

    python recipes/finetune.py                                   # offline default: MiniLM-L6 on `demo`
    python recipes/finetune.py model=bert-large precision=bf16   # any config group
    python recipes/finetune.py -m precision=fp32,bf16            # one run directory per job
"""

import logging
import os
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ampft.config  # noqa: F401  (registers the structured schema before composition)

STARTED = time.perf_counter()


@hydra.main(version_base="1.3", config_path="../conf", config_name="finetune")
def main(cfg: DictConfig) -> float:
    if int(os.environ.get("RANK", "0")) != 0:  # only rank 0 reports; the others speak up on problems
        logging.getLogger().setLevel(logging.WARNING)
    from ampft.checkpointing import CheckpointError
    from ampft.config import ConfigError
    from ampft.data import DataError
    from ampft.engine import Preempted, TrainingDiverged
    from ampft.finetune import run
    from ampft.models import ModelLoadError

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        summary = run(cfg, run_dir, started=STARTED)
    except (ConfigError, DataError, ModelLoadError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except TrainingDiverged as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(3)
    except Preempted as exc:
        print(f"preempted: {exc}", file=sys.stderr)
        if int(os.environ.get("RANK", "0")) == 0:  # for job scripts: launchers do not pass exit code 75 on
            (Path(run_dir) / Preempted.marker).write_text(f"{exc}\n")
        sys.exit(Preempted.exit_code)
    return summary["eval"][cfg.task.main_metric]


if __name__ == "__main__":
    main()

"""Evaluate a saved run or checkpoint: `python recipes/eval.py run=RUN_DIR [file=PATH] [split=train]`.

(Not named evaluate.py: this folder is on sys.path when a recipe runs, and would shadow the `evaluate` library.)"""

import sys

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="../conf/evaluate", config_name="evaluate")
def main(e: DictConfig) -> None:
    from ampft.data import DataError
    from ampft.evaluation.saved import EvaluationError, evaluate_saved

    try:
        out = evaluate_saved(e)
    except (EvaluationError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    metrics = ", ".join(f"{k}={v:.4g}" for k, v in out["metrics"].items())
    print(f"{out['data']}: {metrics} ({out['samples']} examples) -> {out.get('path')}")


if __name__ == "__main__":
    main()

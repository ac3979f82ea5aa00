"""Evaluate a saved run or checkpoint: `python recipes/eval.py run=RUN_DIR [file=PATH] [split=train]`.

Not named evaluate.py: `python recipes/X.py` puts this folder first on sys.path, so a recipe named like a
library (`evaluate`) would shadow it for every import in the run. Every recipe is named so that none shadows
one (tests/e2e/test_exit_codes.py checks it); no recipe edits sys.path."""

import hydra
from omegaconf import DictConfig

import ampft.config  # noqa: F401  (registers the structured schema before composition)
from ampft.errors import compose_errors, exit_on_error


@compose_errors
@hydra.main(version_base="1.3", config_path="../conf/evaluate", config_name="evaluate")
@exit_on_error
def main(e: DictConfig) -> None:
    from ampft.evaluation.saved import evaluate_saved
    from ampft.tracking import clean_console

    with clean_console():
        out = evaluate_saved(e)
    if "path" in out:  # the main process, which wrote eval.json (every rank evaluated its share)
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in out["metrics"].items())
        print(f"{out['data']}: {metrics} ({out['samples']} examples) -> {out['path']}")


if __name__ == "__main__":
    main()

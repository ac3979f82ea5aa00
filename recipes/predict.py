"""Predict with a saved run or checkpoint on a file without labels:
`python recipes/predict.py run=RUN_DIR file=test.tsv [format=glue]` (or checkpoint=RUN_DIR/checkpoints/step_N).

Writes RUN_DIR/predictions/<name>/predictions.jsonl, one row per input in the input's order. No recipe is named
like an importable module (tests/e2e/test_exit_codes.py checks it); no recipe edits sys.path."""

import hydra
from omegaconf import DictConfig

import ampft.config  # noqa: F401  (registers the structured schema before composition)
from ampft.errors import compose_errors, exit_on_error


@compose_errors
@hydra.main(version_base="1.3", config_path="../conf/predict", config_name="predict")
@exit_on_error
def main(e: DictConfig) -> None:
    from ampft.evaluation.predictions import predict_saved
    from ampft.tracking import clean_console

    with clean_console():
        out = predict_saved(e)
    if "path" in out:  # the main process, which wrote the files (every rank predicted its share)
        print(f"{out['file']}: {out['samples']} predictions ({out['precision']}, {out['seconds']:.1f} s) -> "
              f"{out['path']}/{', '.join(out['files'])}")


if __name__ == "__main__":
    main()

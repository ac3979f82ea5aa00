"""Save, find, resume and export.

A checkpoint is `accelerator.save_state` (model, optimizer, scheduler, loss scaler, RNG states of every
rank, and the registered training state) written into `checkpoints/step_<N>.tmp` and renamed to
`checkpoints/step_<N>` only once complete, with a `manifest.json` listing what it holds. A crash during
a save therefore never leaves a half-written `step_<N>`; `latest` ignores anything without a manifest.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

from accelerate import Accelerator

log = logging.getLogger(__name__)
STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    pass


def checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = run_dir / "checkpoints"
    found = [p for p in root.glob("step_*") if STEP_DIR.match(p.name) and (p / "manifest.json").is_file()]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def save(accelerator: Accelerator, run_dir: Path, step: int, keep_last: int, info: dict[str, Any]) -> Path:
    final = run_dir / "checkpoints" / f"step_{step}"
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / "manifest.json").write_text(json.dumps({"step": step, **info, "files": files}, indent=2))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old)
        log.info("checkpoint saved: %s", final)
    accelerator.wait_for_everyone()
    return final


def resolve_resume(run_dir: Path, resume: str | None) -> Path | None:
    """`latest` → newest complete checkpoint of this run dir (None if there is none); a path → checked."""
    if resume is None:
        return None
    if resume == "latest":
        found = checkpoints(run_dir)
        return found[-1] if found else None
    path = Path(resume)
    if not (path / "manifest.json").is_file():
        raise CheckpointError(
            f"checkpoint.resume={resume}: not a complete ampft checkpoint (no manifest.json). "
            f"Complete checkpoints of this run: {[str(p) for p in checkpoints(run_dir)] or 'none'}"
        )
    return path


def export(accelerator: Accelerator, model, tokenizer, out_dir: Path, resolved_config_yaml: str) -> None:
    """A Hugging Face model folder: safetensors weights, config, tokenizer and the ampft config."""
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        unwrapped.save_pretrained(out_dir, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
        (out_dir / "ampft_config.yaml").write_text(resolved_config_yaml)
        log.info("model exported to %s", out_dir)
    accelerator.wait_for_everyone()

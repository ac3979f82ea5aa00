"""Save, verify, find, rotate, resume, restore the best and export.

A checkpoint is `accelerator.save_state` (model, optimizer, scheduler, loss scaler, RNG states of every
rank) plus the training state as `train_state.json`, the resolved `config.yaml` and the model's
`config.json`, written into `checkpoints/step_<N>.tmp`, fsynced, and renamed to `checkpoints/step_<N>`
only once complete, with a `manifest.json` (step, epoch, loss, metric, config hash, lineage, every file
with its size and SHA-256) written last. A crash during a save therefore never leaves a half-written
`step_<N>`; a checkpoint whose files differ from its manifest in any byte is never loaded, and `latest`
falls back to the previous one, saying which ones it skipped and why.

Order: every manifest has `seq` (one more than the highest in the run dir when it was written) and
`parent` (the checkpoint this line of training came from: the previous save of the run, or the one it
resumed from). The line going on is the chain of parents from the newest save; checkpoints off it (an
abandoned line after a resume from an earlier step, or a previous run in a reused folder) rank before all
of it, oldest first. `latest` takes the newest of that order, and rotation deletes from its front.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import pickle
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import is_compiled_module
from accelerate.utils import load as accelerate_load
from omegaconf import OmegaConf

from ampft import files
from ampft.config import flat
from ampft.errors import CheckpointError

log = logging.getLogger(__name__)
STEP_DIR = re.compile(r"^step_(\d+)$")
MANIFEST = "manifest.json"
TRAIN_STATE = "train_state.json"
SCHEDULER = "scheduler.json"  # the LR scheduler, where Accelerate's save_state leaves it out (DeepSpeed)
HASH = "sha256"  # the manifest's key for the checksums (ampft.files.sha256)
PICKLE = re.compile(r"^custom_checkpoint_\d+\.pkl$")  # Accelerate's custom state: unpickled with weights_only=False

# Config keys whose change breaks an exact resume (prefixes). Everything else (logging, evaluation
# interval, max_steps, checkpoint settings, eval batch size) may change between the two runs.
# Padding and compile settings count: batch shapes decide the dropout masks.
EXACTNESS_KEYS = ("model.", "task.", "precision.", "optim.", "scheduler.", "trainer.seed", "trainer.batch_size",
                  "trainer.grad_accum", "trainer.max_grad_norm", "trainer.group_by_length", "trainer.length_group_size",
                  "trainer.length_chunks", "trainer.length_chunk_cost",
                  "trainer.padding", "trainer.pad_to_multiple_of", "trainer.compile", "trainer.epochs")
HARMLESS_KEYS = ("task.max_eval_samples", "task.validation_file", "task.validation_split", "task.positive_label",
                 "precision.max_loss_ratio")
# Harmless in eager mode only: gradient checkpointing recomputes the same ops with the same RNG state (bit-identical
# losses and gradients, dropout included); under trainer.compile the recompute is fused differently (1e-7 apart).
EAGER_HARMLESS_KEYS = ("model.gradient_checkpointing",)


def _step(path: Path) -> int:
    return int(STEP_DIR.match(path.name).group(1))


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def digests(folder: Path, names: list[str], sync: bool = False) -> dict[str, str]:
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        return dict(zip(names, pool.map(lambda n: files.sha256(folder / n, sync), names), strict=True))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def verify(path: Path, content: bool = True) -> list[str]:
    """What is wrong with a checkpoint folder (empty list: complete and as its manifest says).

    content=False checks presence and sizes only (cheap, for listing); True also every file's checksum."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return [f"no {MANIFEST} (an interrupted or foreign save)"]
    try:
        body = json.loads(manifest.read_text())
        files, sums = body["files"], body.get(HASH)
    except (ValueError, KeyError, TypeError) as exc:
        return [f"unreadable {MANIFEST}: {exc}"]
    problems = []
    for name, size in files.items():
        f = path / name
        if not f.is_file():
            problems.append(f"{name} is missing")
        elif f.stat().st_size != size:
            problems.append(f"{name} is {f.stat().st_size} bytes, the manifest says {size}")
    for f in sorted(path.rglob("*")):
        name = str(f.relative_to(path))
        if f.is_file() and name != MANIFEST and name not in files:
            why = "a pickle, which ampft never loads" if PICKLE.match(f.name) else "not in the manifest"
            problems.append(f"unexpected file {name} ({why})")
    if content and not problems:
        if not isinstance(sums, dict) or set(sums) != set(files):
            problems.append(f"the manifest has no {HASH} checksums (written by an older ampft): its content "
                            "cannot be checked")
        else:
            problems += [f"{name} does not match its {HASH} checksum (corrupted: same size, other bytes)"
                         for name, got in digests(path, sorted(files)).items() if got != sums[name]]
    return problems


def _order(good: list[Path]) -> list[Path]:
    """Oldest first; the last is the newest save of the line going on (see the module docstring)."""
    info = {p: manifest(p) for p in good}
    by_seq = sorted(good, key=lambda p: (info[p].get("seq", 0), info[p].get("created", 0), _step(p)))
    if not by_seq:
        return []
    names = {p.name: p for p in good}
    line = [by_seq[-1]]
    while (parent := info[line[-1]].get("parent")) and (p := names.get(parent.get("name"))) is not None \
            and info[p].get("seq") == parent.get("seq") and p not in line:
        line.append(p)
    return [p for p in by_seq if p not in line] + line[::-1]


def scan(run_dir: Path, content: bool = False) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(complete checkpoints in timeline order, oldest first; [(skipped folder, why)])."""
    root = Path(run_dir) / "checkpoints"
    good, skipped = [], []
    for p in sorted(root.glob("step_*")):
        if not STEP_DIR.match(p.name):
            skipped.append((p, "an unfinished save or deletion (temporary folder)"))
        elif problems := verify(p, content):
            skipped.append((p, "; ".join(problems)))
        else:
            good.append(p)
    return _order(good), skipped


def checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints (sizes checked) in timeline order: the last is the newest of the line going on."""
    return scan(run_dir)[0]


def manifest(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / MANIFEST).read_text())


def clean(root: Path) -> None:
    """Remove what interrupted saves (`step_N.tmp`) and deletions (`step_N.deleting`) left behind."""
    for p in sorted(root.glob("step_*")):
        if p.is_dir() and not STEP_DIR.match(p.name) and p.suffix in (".tmp", ".deleting"):
            log.info("removing %s (left by an interrupted save or deletion)", p)
            shutil.rmtree(p, ignore_errors=True)


def _remove(path: Path) -> None:
    """Delete a checkpoint so that an interruption never leaves a half-deleted `step_N` behind."""
    aside = path.with_name(path.name + ".deleting")
    path.rename(aside)
    shutil.rmtree(aside)


def _next_seq(root: Path) -> int:
    seqs = [0]
    for p in root.glob("step_*/" + MANIFEST):
        with contextlib.suppress(ValueError, OSError, TypeError, AttributeError):  # a foreign or torn manifest
            seqs.append(int(json.loads(p.read_text()).get("seq", 0)))
    return max(seqs) + 1


def _bytes_needed(run_dir: Path, accelerator: Accelerator) -> int:
    """About what one checkpoint takes: the newest one's size, else weights + AdamW's two fp32 moments."""
    found = checkpoints(run_dir)
    if found:
        return sum(manifest(found[-1])["files"].values())
    params = [p for m in accelerator._models for p in m.parameters()]
    return sum(p.numel() * p.element_size() + 8 * p.numel() for p in params)


def save(accelerator: Accelerator, run_dir: Path, step: int, info: dict[str, Any], state: dict[str, Any],
         config: dict[str, Any], model_config, keep_last: int, keep_best: int = 0, mode: str = "max",
         parent: Path | None = None, scheduler=None) -> Path:
    """Write a checkpoint atomically, then rotate: keep the last `keep_last` of the timeline and the best
    `keep_best`. `parent`: the checkpoint this line of training continues (the previous save, or the one
    it resumed from). A failed write (a full disk) leaves the earlier checkpoints as they were."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step}"
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        clean(root)
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            (tmp / TRAIN_STATE).write_text(json.dumps(state, indent=1))
            if _scheduler_left_out(accelerator, scheduler):
                (tmp / SCHEDULER).write_text(json.dumps(scheduler.state_dict(), indent=1))
            (tmp / "config.yaml").write_text(OmegaConf.to_yaml(config))
            model_config.to_json_file(tmp / "config.json")  # the architecture, to evaluate this checkpoint alone
            names = [str(p.relative_to(tmp)) for p in sorted(tmp.rglob("*")) if p.is_file()]
            sums = digests(tmp, names, sync=True)  # read back and flushed to disk
            lineage = None
            if parent is not None and (Path(parent) / MANIFEST).is_file():
                lineage = {"name": Path(parent).name, "seq": manifest(parent).get("seq", 0)}
            body = {"step": step, **info, "config_hash": config_hash(config), "created": time.time(),
                    "seq": _next_seq(root), "parent": lineage,
                    "files": {n: (tmp / n).stat().st_size for n in names}, HASH: sums}
            with open(tmp / MANIFEST, "w") as f:  # written last: its presence means complete
                f.write(json.dumps(body, indent=2))
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
    except Exception as exc:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(root).free
        need = _bytes_needed(run_dir, accelerator)
        full = getattr(exc, "errno", None) == errno.ENOSPC or "No space left" in str(exc) or free < need
        raise CheckpointError(
            f"could not write checkpoint {final.name} into run dir {run_dir}: {type(exc).__name__}: {exc}\n"
            f"  free space there: {free / 2**20:.1f} MiB; a checkpoint needs about {need / 2**20:.1f} MiB"
            + (" (the disk is full)" if full else "") + ".\n"
            f"  The earlier checkpoints are intact: {[p.name for p in checkpoints(run_dir)] or 'none'}. Free "
            "some space (or lower checkpoint.keep_last) and resume with checkpoint.resume=latest."
        ) from exc
    if accelerator.is_main_process:
        replaced = None
        if final.exists():  # the same step of an abandoned line: replaced only once the new one is complete
            replaced = final.with_name(final.name + ".deleting")
            final.rename(replaced)
        tmp.rename(final)
        _fsync_dir(root)
        if replaced is not None:
            shutil.rmtree(replaced)
        for old in rotate(checkpoints(run_dir), keep_last, keep_best, mode):
            _remove(old)
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


def restore_best(accelerator: Accelerator, run_dir: Path, mode: str) -> Path | None:
    """Load the run's best checkpoint (by its recorded metric; the best whose every byte verifies) into the
    prepared objects, for exporting its weights; return it, or None (nothing loaded) when no checkpoint has
    a metric that verifies. Model, optimizer, scaler and RNG states become the checkpoint's; the training
    state is not touched."""
    found = checkpoints(run_dir)
    for path in best(found, mode, k=len(found)):
        if problems := verify(path):
            log.warning("not exporting %s, the best checkpoint by its metric: %s", path, "; ".join(problems))
            continue
        load(accelerator, path)
        return path
    return None


def rotate(found: list[Path], keep_last: int, keep_best: int, mode: str) -> list[Path]:
    """Checkpoints to delete: all but the last `keep_last` of `found` (in timeline order) and the best
    `keep_best`."""
    keep = set(found[-keep_last:]) | set(best(found, mode, keep_best) if keep_best else [])
    return [p for p in found if p not in keep]


def resolve_resume(run_dir: Path, resume: str | None) -> Path | None:
    """`latest` → the newest checkpoint of the line going on whose every byte verifies (None if none);
    a path → that checkpoint, verified."""
    if resume is None:
        return None
    if resume == "latest":
        good, skipped = scan(run_dir)
        chosen = None
        for path in reversed(good):
            if problems := verify(path, content=True):
                skipped.append((path, "; ".join(problems)))
            else:
                chosen = path
                break
        for path, why in skipped:
            log.warning("checkpoint.resume=latest: skipping %s: %s", path, why)
        return chosen
    path = Path(resume)
    problems = verify(path) if path.is_dir() else ["no such folder"]
    if problems:
        raise CheckpointError(
            f"checkpoint.resume={resume} cannot be loaded: {'; '.join(problems)}. "
            f"Complete checkpoints of this run: {[str(p) for p in checkpoints(run_dir)] or 'none'} "
            "(or checkpoint.resume=latest)."
        )
    return path


def _scheduler_left_out(accelerator: Accelerator, scheduler) -> bool:
    """Under DeepSpeed, `prepare(scheduler)` hands the scheduler back bare and `save_state` leaves it out;
    ampft then keeps its state as JSON beside the training state (registering it with Accelerate would
    pickle it)."""
    return scheduler is not None and scheduler not in accelerator._schedulers


def load(accelerator: Accelerator, path: Path, scheduler=None) -> dict[str, Any]:
    """Load a verified checkpoint into the prepared objects; return its training state (plain JSON).

    Nothing here unpickles arbitrary objects: weights come from safetensors, the optimizer, scheduler,
    scaler and RNG states through `torch.load(weights_only=True)` (Accelerate's default), and the
    training state from JSON. A folder with a pickled custom state is refused before anything is read."""
    path = Path(path)
    pickles = sorted(p.name for p in path.iterdir() if PICKLE.match(p.name))
    if pickles:
        raise CheckpointError(
            f"checkpoint {path} holds {', '.join(pickles)}: a pickle, which ampft never loads (unpickling runs "
            f"code). Checkpoints of this ampft keep the training state in {TRAIN_STATE}; resume from one of those.")
    if not (path / TRAIN_STATE).is_file():
        raise CheckpointError(f"checkpoint {path} has no {TRAIN_STATE}: not an ampft checkpoint of this version")
    try:
        state = json.loads((path / TRAIN_STATE).read_text())
    except ValueError as exc:
        raise CheckpointError(f"checkpoint {path}: {TRAIN_STATE} is not valid JSON: {exc}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path}: {TRAIN_STATE} must hold an object, not {type(state).__name__}")
    # Accelerate loads the RNG states weights-only too, but on failure it only logs and goes on (the resume
    # would silently not be exact): read them first, the same way, and refuse instead.
    for rng in sorted(path.glob("random_states_*.pkl")):
        try:
            accelerate_load(rng)
        except Exception as exc:
            raise CheckpointError(f"checkpoint {path}: {rng.name} is not a plain RNG state (loaded weights-only, "
                                  f"nothing executed): {type(exc).__name__}: {str(exc)[:300]}") from None
    try:
        accelerator.load_state(str(path))
    except (pickle.UnpicklingError, RuntimeError, ValueError, KeyError, OSError) as exc:
        raise CheckpointError(f"checkpoint {path} could not be loaded (weights-only loading, nothing executed): "
                              f"{type(exc).__name__}: {str(exc)[:500]}") from None
    if _scheduler_left_out(accelerator, scheduler):
        if not (path / SCHEDULER).is_file():
            raise CheckpointError(f"checkpoint {path} has no {SCHEDULER}: the learning-rate schedule could not be "
                                  "resumed (a checkpoint written without it, e.g. by another backend)")
        try:
            scheduler.load_state_dict(json.loads((path / SCHEDULER).read_text()))
        except (ValueError, TypeError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {path}: {SCHEDULER} is not a scheduler state: {exc}") from None
    return state


def breaking_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Keys that differ between the checkpoint's config and this run's and break an exact resume."""
    a, b = flat(saved), flat(current)
    out = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key) or key.startswith(HARMLESS_KEYS):
            continue
        compiled = a.get("trainer.compile") or b.get("trainer.compile")
        if key in EAGER_HARMLESS_KEYS and (not compiled or bool(a.get(key)) == bool(b.get(key))):
            continue  # (a checkpoint from before the key existed has none: off)
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
    if is_compiled_module(model):  # torch.compile's wrapper would prefix every key with `_orig_mod.`
        model = model._orig_mod
    unwrapped = accelerator.unwrap_model(model)
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        expected = set(unwrapped.state_dict())
        if set(state_dict) != expected:  # from_pretrained would start those weights from random, with a warning
            odd = sorted(set(state_dict) ^ expected)
            raise RuntimeError(f"the export's weights are not the model's, key for key ({len(odd)} differ, e.g. "
                               f"{odd[:3]}): not writing {out_dir}")
        unwrapped.save_pretrained(out_dir, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
        (out_dir / "ampft_config.yaml").write_text(OmegaConf.to_yaml(config))
        (out_dir / "README.md").write_text(card)
        log.info("model exported to %s", out_dir)
    accelerator.wait_for_everyone()

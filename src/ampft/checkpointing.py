"""Save, verify, find, rotate, resume, restore the best and export checkpoints.

A checkpoint is `accelerator.save_state` plus `train_state.json`, `config.yaml`, the model's `config.json` and,
written last, a sealed `manifest.json` (sizes, SHA-256, lineage); it is complete or absent, every byte is checked
before a load, and `latest` and rotation follow the line of training going on (`checkpoints/line.json`, `seq`,
`parent`) and the health verdicts: docs/architecture.md, "A checkpoint is complete or absent" and after.
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
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import is_compiled_module
from accelerate.utils import load as accelerate_load
from omegaconf import OmegaConf

from ampft import files
from ampft.config import flat, schema_meta
from ampft.errors import CheckpointError
from ampft.files import file_digest

log = logging.getLogger(__name__)
STEP_DIR = re.compile(r"^step_(\d+)$")
MANIFEST = "manifest.json"
TRAIN_STATE = "train_state.json"
SCHEDULER = "scheduler.json"  # the LR scheduler, where Accelerate's save_state leaves it out (DeepSpeed)
HASH = "sha256"  # the manifest's key for the checksums (ampft.files.sha256)
LINE = "line.json"  # checkpoints/line.json: where the line of training going on started (`mark_line`)
SEAL = "manifest_sha256"  # the manifest's checksum of its own other keys (an edited `seq` or `parent` shows)
PICKLE = re.compile(r"^custom_checkpoint_\d+\.pkl$")  # Accelerate's custom state: unpickled with weights_only=False

# Changes a resume cannot apply, refused even with checkpoint.allow_config_change (key prefix: why).
NOT_ON_RESUME = {
    "trainer.seed": "a resume goes on with the checkpoint's random states (dropout masks, data order); a seed only "
                    "starts a run: start a new run for another seed",
}
DEEPSPEED_SCALER = dict.fromkeys(("precision.init_scale", "precision.growth_factor", "precision.backoff_factor",
                                  "precision.growth_interval", "precision.hysteresis", "precision.static_scale"),
                                 "DeepSpeed restores its fp16 loss scaler from its own checkpoint files, whatever "
                                 "the config says")


def data_digests(config: dict[str, Any]) -> dict[str, str | None]:
    """The local training file's content digest by config key (None: unreadable now), for a resume to compare."""
    if (path := config["task"].get("train_file")) is None:
        return {}
    with contextlib.suppress(OSError):
        return {"task.train_file": file_digest(path)}
    return {"task.train_file": None}


def digests(folder: Path, names: list[str], sync: bool = False) -> dict[str, str]:
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        return dict(zip(names, pool.map(lambda n: files.sha256(folder / n, sync), names), strict=True))


def _seal(body: dict[str, Any]) -> str:
    """SHA-256 of a manifest's keys other than the seal itself, in a canonical JSON form."""
    rest = {k: v for k, v in body.items() if k != SEAL}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def manifest(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / MANIFEST).read_text())


def write_manifest(folder: Path, body: dict[str, Any]) -> None:
    """Write a checkpoint's manifest with its seal, atomically and durably (never a torn one)."""
    files.write_atomic(Path(folder) / MANIFEST, json.dumps({**body, SEAL: _seal(body)}, indent=2))


def verify(path: Path, content: bool = True) -> list[str]:
    """What is wrong with a checkpoint folder (empty: as its manifest says). content=False checks presence and
    sizes only (cheap, for listing), True also every checksum; the manifest's seal is checked either way."""
    if not (path / MANIFEST).is_file():
        return [f"no {MANIFEST} (an interrupted or foreign save)"]
    try:
        body = manifest(path)
        listed, sums = body["files"], body.get(HASH)
    except (ValueError, KeyError, TypeError) as exc:
        return [f"unreadable {MANIFEST}: {exc}"]
    if SEAL not in body:
        return [f"{MANIFEST} has no {SEAL} (written by an older ampft): its lineage and step cannot be checked"]
    if body[SEAL] != _seal(body):
        return [f"{MANIFEST} does not match its own {SEAL} (edited or corrupted after the save): its step, lineage "
                "and checksums cannot be trusted"]
    problems = []
    for name, size in listed.items():
        if not (f := path / name).is_file():
            problems.append(f"{name} is missing")
        elif f.stat().st_size != size:
            problems.append(f"{name} is {f.stat().st_size} bytes, the manifest says {size}")
    for f in sorted(path.rglob("*")):
        if f.is_file() and (name := str(f.relative_to(path))) not in (MANIFEST, MANIFEST + ".tmp", *listed):
            why = "a pickle, which ampft never loads" if PICKLE.match(f.name) else "not in the manifest"
            problems.append(f"unexpected file {name} ({why})")
    if content and not problems:
        if not isinstance(sums, dict) or set(sums) != set(listed):
            problems.append(f"the manifest has no {HASH} checksums (written by an older ampft): its content "
                            "cannot be checked")
        else:
            problems += [f"{name} does not match its {HASH} checksum (corrupted: same size, other bytes)"
                         for name, got in digests(path, sorted(listed)).items() if got != sums[name]]
    return problems


def scan(run_dir: Path) -> tuple[list[Path], list[Path], list[tuple[Path, str]]]:
    """(complete checkpoints off the line going on, oldest first; the line going on, from its start; [(skipped
    folder, why)]). A line marker newer than every save means a run started from its `parent` and has not saved
    yet: the line ends there."""
    root = Path(run_dir) / "checkpoints"
    good, sealed, skipped = [], {}, []
    for p in sorted(root.glob("step_*")):
        if not STEP_DIR.match(p.name):
            skipped.append((p, "an unfinished save or deletion (temporary folder)"))
            continue
        if (body := _sealed(p)) is not None:
            sealed[p] = body
        if problems := verify(p, content=False):
            skipped.append((p, "; ".join(problems)))
        else:
            good.append(p)
    by_seq = sorted(sealed, key=lambda p: (sealed[p].get("seq", 0), sealed[p].get("created", 0), int(p.name[5:])))
    start, line = _line_start(root), lineage(by_seq[-1]) if by_seq else []
    if by_seq and start is not None and start.get("seq", 0) > sealed[by_seq[-1]].get("seq", 0):
        parent = start.get("parent")
        line = lineage(root / parent["name"], parent.get("seq")) if parent else []
    return [p for p in by_seq if p in good and p not in line], [p for p in line[::-1] if p in good], skipped


def _sealed(path: Path) -> dict[str, Any] | None:
    """A checkpoint's manifest if its seal holds (None: missing, unreadable, torn or edited)."""
    with contextlib.suppress(ValueError, OSError, AttributeError):  # unreadable, torn or not a JSON object
        if (body := manifest(path)).get(SEAL) == _seal(body):
            return body
    return None


def lineage(path: Path | None, seq: int | None = None) -> list[Path]:
    """`path` (if its manifest says `seq`, when given) and its ancestors, newest first: the chain of parents traced
    through sealed manifests, damaged files or not, so a damaged newest save still ends a line at its parent."""
    line: list[Path] = []
    while path is not None and path not in line and (body := _sealed(path)) and seq in (None, body.get("seq")):
        line.append(path)
        parent = body.get("parent")
        path, seq = (path.parent / parent["name"], parent.get("seq")) if parent else (None, None)
    return line


def checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints (sizes checked) in timeline order: the last is the newest of the line going on."""
    off, line, _ = scan(run_dir)
    return off + line


def _line_start(root: Path) -> dict[str, Any] | None:
    """The line marker of `root` (checkpoints/), or None (none, or unreadable: then the newest save decides)."""
    if not (path := root / LINE).is_file():
        return None
    with contextlib.suppress(ValueError, OSError):
        if isinstance(body := json.loads(path.read_text()), dict) and isinstance(body.get("seq"), int):
            return body
    log.warning("%s is unreadable: ignored (the newest checkpoint decides the line going on)", path)
    return None


def _next_seq(root: Path) -> int:
    """One more than any `seq` of the line marker and the sealed manifests (the others are in no line)."""
    sealed = [body for p in root.glob("step_*") if (body := _sealed(p)) is not None]
    return max([(_line_start(root) or {}).get("seq", 0), *(body.get("seq", 0) for body in sealed)]) + 1


def _ref(path: Path) -> dict[str, Any]:
    """How a manifest or the line marker names its parent: by folder name and `seq` (a reused name shows)."""
    return {"name": path.name, "seq": manifest(path).get("seq", 0)}


def mark_line(run_dir: Path, start: Path | None, run_id: str | None) -> None:
    """Record, before training (main process), that a run starts a line here from `start` (None: scratch), so a
    crash before its first save leaves `latest` at `start`, not at the abandoned line's newest save."""
    root = Path(run_dir) / "checkpoints"
    if not any(root.glob("step_*")):
        return
    on_line = start is not None and Path(start).parent.resolve() == root.resolve()
    body = {"seq": _next_seq(root), "parent": _ref(Path(start)) if on_line else None, "run_id": run_id,
            "created": time.time()}
    files.write_atomic(root / LINE, json.dumps(body, indent=1))


def healthy(path: Path) -> bool | None:
    """True/False once the losses its weights produced passed/failed the divergence checks; None: not yet."""
    return None if (verdict := manifest(path).get("health")) is None else bool(verdict["ok"])


def record_health(path: Path, ok: bool, loss: float | None, step: int, why: str | None = None) -> None:
    """Record the verdict in the manifest (main process): `loss`, the mean loss of the first update trained
    from these weights, in optimizer step `step`."""
    write_manifest(path, {**manifest(path), "health": {"ok": ok, "loss": loss, "step": step, "why": why}})


def known_good(path: Path | None) -> Path | None:
    """The newest known-good checkpoint among `path` and its ancestors (None if none is left)."""
    return next((p for p in lineage(path) if healthy(p) and not verify(p, content=False)), None)


def clean(root: Path) -> None:
    """Remove what interrupted saves (`step_N.tmp`) and deletions (`step_N.deleting`) left behind."""
    for p in sorted(root.glob("step_*")):
        if p.is_dir() and p.suffix in (".tmp", ".deleting"):
            log.info("removing %s (left by an interrupted save or deletion)", p)
            with contextlib.suppress(OSError):
                _delete(p)


def _delete(path: Path) -> None:
    """Delete a checkpoint folder; of a symbolic link only the link (what it points to is never deleted)."""
    if path.is_symlink():
        log.warning("removing the link %s; the checkpoint it points to, %s, is left as it is (delete it yourself "
                    "if it is no longer wanted)", path, os.readlink(path))
        path.unlink()
    else:
        shutil.rmtree(path)


def _remove(path: Path) -> None:
    """Delete a checkpoint so that an interruption never leaves a half-deleted `step_N` behind."""
    aside = path.with_name(path.name + ".deleting")
    path.rename(aside)
    _delete(aside)


def save(accelerator: Accelerator, run_dir: Path, step: int, info: dict[str, Any], state: dict[str, Any],
         config: dict[str, Any], model_config, keep_last: int, keep_best: int = 0, mode: str = "max",
         parent: Path | None = None, scheduler=None, run_id: str | None = None) -> Path:
    """Write a checkpoint atomically, then rotate (`rotate`). `parent`: the checkpoint this line continues. A
    failed write (a full disk) leaves the earlier checkpoints as they were."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step}"
    tmp, aside = final.with_name(final.name + ".tmp"), final.with_name(final.name + ".deleting")
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
            ref = _ref(Path(parent)) if parent is not None and (Path(parent) / MANIFEST).is_file() else None
            write_manifest(tmp, {  # written last: its presence means complete
                "step": step, **info, "created": time.time(), "seq": _next_seq(root), "parent": ref, "run_id": run_id,
                "health": None, "world_size": accelerator.num_processes,
                "data": data_digests(config), "files": {n: (tmp / n).stat().st_size for n in names},
                HASH: digests(tmp, names, sync=True)})  # read back and flushed to disk
    except Exception as exc:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        found = checkpoints(run_dir)  # about what one takes: the newest one, else weights + AdamW's fp32 moments
        need = sum(manifest(found[-1])["files"].values()) if found else \
            sum(p.numel() * (p.element_size() + 8) for m in accelerator._models for p in m.parameters())
        raise CheckpointError(
            f"could not write checkpoint {final.name} into run dir {run_dir}: {type(exc).__name__}: {exc}\n"
            + _space(exc, root, need, "a checkpoint needs") + "\n"
            f"  The earlier checkpoints are intact: {[p.name for p in found] or 'none'}. Free "
            "some space (or lower checkpoint.keep_last) and resume with checkpoint.resume=latest."
        ) from exc
    if accelerator.is_main_process:
        replacing = final.exists()  # the same step of an abandoned line: replaced only once the new one is complete
        if replacing:
            final.rename(aside)
        tmp.rename(final)
        files.fsync_dir(root)
        if replacing:
            _delete(aside)
        off, line, _ = scan(run_dir)
        for old in rotate(off + line, keep_last, keep_best, mode, line, run_id):
            _remove(old)
        log.info("checkpoint saved: %s", final)
    accelerator.wait_for_everyone()
    return final


def best(found: list[Path], mode: str, k: int = 1) -> list[Path]:
    """The k best by recorded metric (none without one, none whose weights diverged)."""
    scored = {p: v for p in found
              if (v := (manifest(p).get("metric") or {}).get("value")) is not None and healthy(p) is not False}
    return sorted(scored, key=scored.get, reverse=mode == "max")[:k]


def of_run(found: list[Path], run_id: str | None) -> list[Path]:
    """The checkpoints run `run_id` and its resumes wrote, never a previous run's in a reused folder (None: all)."""
    return found if run_id is None else [p for p in found if manifest(p).get("run_id") == run_id]


def restore_best(accelerator: Accelerator, run_dir: Path, mode: str, run_id: str | None = None) -> Path | None:
    """Load run `run_id`'s best checkpoint that verifies into the prepared objects (for export) and return it;
    None: none has a metric and verifies. The training state is not touched."""
    found = of_run(checkpoints(run_dir), run_id)
    for path in best(found, mode, k=len(found)):
        if not (problems := verify(path)):
            load(accelerator, path)
            return path
        log.warning("not exporting %s, the best checkpoint by its metric: %s", path, "; ".join(problems))
    return None


def rotate(found: list[Path], keep_last: int, keep_best: int, mode: str, line: list[Path] | None = None,
           run_id: str | None = None) -> list[Path]:
    """Checkpoints to delete: all but the last `keep_last` of `found` (timeline order), the best `keep_best` of
    run `run_id` and the newest known good of `line` (default `found`): that one is where a divergence sends
    the user back to."""
    keep = set(found[-keep_last:]) | set(best(of_run(found, run_id), mode, keep_best) if keep_best else [])
    keep |= set([p for p in (found if line is None else line) if healthy(p)][-1:])
    return [p for p in found if p not in keep]


def _refusal(path: Path) -> list[str]:
    """Why a checkpoint cannot be resumed from (empty: it can): it does not verify, or its weights diverged."""
    if (problems := verify(path)) or healthy(path) is not False:
        return problems
    h = manifest(path)["health"]
    loss = "" if h.get("loss") is None else f", {h['loss']:.4g}"
    return [f"its weights diverged (the loss they produced in step {h['step']}{loss} failed the divergence check: "
            f"{h['why']}); resume from the checkpoint the divergence message named"]


def resolve_resume(run_dir: Path, resume: str | None) -> Path | None:
    """`latest` → the newest checkpoint of the line going on whose every byte verifies (None if none);
    a path → that checkpoint, verified."""
    if resume is None:
        return None
    if resume == "latest":
        off, line, skipped = scan(run_dir)
        for path in off:
            log.info("checkpoint.resume=latest: not %s: off the line of training going on (an abandoned line, or a "
                     "previous run's)", path)
        chosen = None
        for path in reversed(line):
            if not (problems := _refusal(path)):
                chosen = path
                break
            skipped.append((path, "; ".join(problems)))
        for path, why in skipped:
            log.warning("checkpoint.resume=latest: skipping %s: %s", path, why)
        return chosen
    path = Path(resume)
    if problems := _refusal(path) if path.is_dir() else ["no such folder"]:
        others = [str(p) for p in checkpoints(run_dir) if p.resolve() != path.resolve()]
        raise CheckpointError(
            f"checkpoint.resume={resume} cannot be loaded: {'; '.join(problems)}. "
            f"Other complete checkpoints of this run (sizes checked): {others or 'none'} "
            "(or checkpoint.resume=latest)."
        )
    return path


def _scheduler_left_out(accelerator: Accelerator, scheduler) -> bool:
    """Under DeepSpeed `save_state` leaves the scheduler out; ampft keeps it as JSON (registering it with
    Accelerate would pickle it)."""
    return scheduler is not None and scheduler not in accelerator._schedulers


def load(accelerator: Accelerator, path: Path, scheduler=None) -> dict[str, Any]:
    """Load a verified checkpoint into the prepared objects; return its training state. Nothing is unpickled
    (docs/architecture.md, "What a load trusts"): a folder with a pickled custom state is refused first."""
    path = Path(path)
    if pickles := sorted(p.name for p in path.iterdir() if PICKLE.match(p.name)):
        raise CheckpointError(
            f"checkpoint {path} holds {', '.join(pickles)}: a pickle, which ampft never loads (unpickling runs "
            f"code). Checkpoints of this ampft keep the training state in {TRAIN_STATE}; resume from one of those.")
    try:
        state = json.loads((path / TRAIN_STATE).read_text())
    except (OSError, ValueError) as exc:  # its keys and types are TrainState's to check
        raise CheckpointError(f"checkpoint {path}: no readable {TRAIN_STATE} ({exc}): not an ampft checkpoint of "
                              "this version") from None
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
        try:
            scheduler.load_state_dict(json.loads((path / SCHEDULER).read_text()))
        except OSError:
            raise CheckpointError(f"checkpoint {path} has no {SCHEDULER}: the learning-rate schedule could not be "
                                  "resumed (a checkpoint written without it, e.g. by another backend)") from None
        except (ValueError, TypeError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {path}: {SCHEDULER} is not a scheduler state: {exc}") from None
    return state


def breaking_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Keys that differ between the two configs and break an exact resume (`ampft.config.setting(exact=...)`).
    "compiled": gradient checkpointing recomputes the same ops with the same RNG state (bit-identical losses and
    gradients, dropout included); under trainer.compile the recompute is fused differently (1e-7 apart). A
    checkpoint from before a key existed has none: off."""
    a, b = flat(saved), flat(current)
    compiled = a.get("trainer.compile") or b.get("trainer.compile")
    out = []
    for key in sorted(set(a) | set(b)):
        exact = schema_meta(key, "exact")
        if a.get(key) == b.get(key) or not exact:
            continue
        if exact == "compiled" and (not compiled or bool(a.get(key)) == bool(b.get(key))):
            continue
        out.append(f"{key}: {a.get(key)!r} -> {b.get(key)!r}")
    return out


def _layout(config: dict[str, Any]) -> str:
    """Whose checkpoint files a run writes and reads: Accelerate's (one process, DDP), DeepSpeed's (ZeRO-1 and 2
    alike, each other stage its own) or FSDP2's sharded ones."""
    d = config.get("distributed", {})
    backend = str(d.get("backend", "single"))
    if backend == "deepspeed":
        stage = d.get("zero_stage", 2)
        return f"DeepSpeed ZeRO-{'1/2' if stage in (1, 2) else stage}"
    return "FSDP2" if backend == "fsdp" else "one process or DDP"


def check_config(path: Path, current: dict[str, Any], allow: bool, world_size: int = 1) -> list[str]:
    """Refuse (or, allowed, warn about and return) changes that break an exact resume: config keys, the number
    of processes (so the global batch) and the training data's content."""
    saved = OmegaConf.to_container(OmegaConf.load(Path(path) / "config.yaml"))
    if (written := _layout(saved)) != (reader := _layout(current)):
        name = saved.get("distributed", {}).get("name", "single")
        raise CheckpointError(
            f"checkpoint {path} was written by {written} (distributed={name}) and cannot be loaded by {reader} "
            f"(distributed={current['distributed']['name']}): each backend reads only its own checkpoint files; "
            f"resume with distributed={name}")
    body = manifest(path)
    changes = breaking_changes(saved, current)
    if (was := body.get("world_size")) not in (None, world_size):
        batch = [c["trainer"]["batch_size"] * c["trainer"]["grad_accum"] * w for c, w in ((saved, was),
                                                                                          (current, world_size))]
        changes.append(f"processes (world size): {was} -> {world_size}, so the global batch: {batch[0]} -> "
                       f"{batch[1]} examples per update")
    now = data_digests(current)
    for key, digest in (body.get("data") or {}).items():
        if now.get(key) == digest:  # the same data: a file moved or renamed is not a change
            changes = [c for c in changes if not c.startswith(f"{key}: ")]
        elif key in now:
            changes.append(f"{key}={flat(current).get(key)}: its content is not what the checkpoint trained on "
                           f"(content digest {digest} -> {now[key]})")
    why_not = NOT_ON_RESUME | (DEEPSPEED_SCALER if str(current["distributed"]["backend"]) == "deepspeed" else {})
    if refused := [f"  - {c}: {why}" for c in changes for key, why in why_not.items() if c.startswith(f"{key}: ")]:
        raise CheckpointError(f"checkpoint {path}: these changes cannot take effect on a resume, not even with "
                              "checkpoint.allow_config_change=true:\n" + "\n".join(refused))
    listing = "\n".join(f"  - {c}" for c in changes)
    if changes and allow:
        log.warning("resuming %s with a changed config (checkpoint.allow_config_change=true); the run goes on with "
                    "the config as given:\n%s", path, listing)
    elif changes:
        raise CheckpointError(
            f"checkpoint {path} was written with a different config; resuming would not continue the same "
            f"run:\n{listing}\nUse the same settings, or pass checkpoint.allow_config_change=true to resume anyway.")
    return changes


def export(accelerator: Accelerator, model, tokenizer, out_dir: Path, config: dict[str, Any], card: str,
           step: int, source: Path | None = None) -> None:
    """Write a Hugging Face model folder (safetensors, config, tokenizer, ampft config, model card). `source`:
    the checkpoint the weights came from, if any. A failed write is a CheckpointError (`_export_failed`)."""
    accelerator.wait_for_everyone()
    if is_compiled_module(model):  # torch.compile's wrapper would prefix every key with `_orig_mod.`
        model = model._orig_mod
    unwrapped = accelerator.unwrap_model(model)
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        # Keys that differ: from_pretrained would start those weights from random, with a warning.
        if odd := sorted(set(state_dict) ^ set(unwrapped.state_dict())):
            raise RuntimeError(f"the export's weights are not the model's, key for key ({len(odd)} differ, e.g. "
                               f"{odd[:3]}): not writing {out_dir}")

        def write(folder: Path) -> None:  # save_pretrained empties the dict it is given: a copy each time
            unwrapped.save_pretrained(folder, state_dict=dict(state_dict), safe_serialization=True)
            tokenizer.save_pretrained(folder)
            (folder / "ampft_config.yaml").write_text(OmegaConf.to_yaml(config))
            (folder / "README.md").write_text(card)

        try:
            write(out_dir)
        except Exception as exc:  # safetensors reports a full disk as a SafetensorError, not an OSError
            need = sum(t.numel() * t.element_size() for t in state_dict.values())
            raise _export_failed(exc, write, Path(out_dir), need, step, source) from exc
        log.info("model exported to %s", out_dir)
    accelerator.wait_for_everyone()


def _space(exc: Exception, folder: Path, need: int, what: str) -> str:
    """The free-space line of a failed write's error (safetensors reports a full disk as StorageFull)."""
    free = shutil.disk_usage(folder).free
    full = getattr(exc, "errno", None) == errno.ENOSPC or free < need \
        or any(s in str(exc) for s in ("No space left", "StorageFull"))
    return (f"  free space there: {free / 2**20:.1f} MiB; {what} about {need / 2**20:.1f} MiB"
            + (" (the disk is full)" if full else "") + ".")


def _export_failed(exc: Exception, write, out_dir: Path, need: int, step: int, source: Path | None) -> CheckpointError:
    """Remove the partial export (never mistaken for a model), keep the weights where possible (their source
    checkpoint, else under $TMPDIR) and say where they are, or that they are lost."""
    shutil.rmtree(out_dir, ignore_errors=True)
    run_dir, kept = out_dir.parent, None
    rescue = Path(tempfile.gettempdir()) / f"ampft-rescued-{run_dir.name}-step_{step}"
    if source is not None:
        kept = f"These weights are checkpoint {source}'s, which is intact: nothing is lost."
    elif shutil.disk_usage(rescue.parent).free > need + 64 * 2**20:
        try:
            write(rescue)
            kept = (f"The trained weights (step {step}) are saved in {rescue} instead, as the exported model "
                    f"folder: move it to {out_dir} once there is room ($TMPDIR chooses where this goes).")
        except Exception as again:
            shutil.rmtree(rescue, ignore_errors=True)
            log.warning("could not keep the weights in %s either: %s", rescue, again)
    if kept is None:
        found = checkpoints(run_dir)
        kept = (f"The final weights (step {step}) could not be kept anywhere; the newest checkpoint, "
                f"{found[-1]} (step {manifest(found[-1])['step']}), is intact." if found else
                f"No checkpoint of this run exists and no other disk had room: the trained weights (step "
                f"{step}) are lost (checkpoint.every=N saves them as training goes).")
    return CheckpointError(
        f"could not export the model to {out_dir}: {type(exc).__name__}: {exc}\n"
        + _space(exc, run_dir, need, "the model's weights need") + f"\n  {kept}\n  Free some space in {run_dir} (or give "
        "hydra.run.dir= on a disk with room for the next run)."
    )

"""The project's errors: one base class, each subclass with the exit code a recipe ends with (2; TrainingDiverged 3;
Preempted 75) and a builtin base (ValueError, RuntimeError, ImportError) for code that catches those.
`exit_on_error` (around each recipe's main) is the one place an error becomes an exit code, `compose_errors` (around
its `@hydra.main` entry) the same for Hydra's compose errors. Imports nothing from ampft: every module may import it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import sys
import traceback
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any


class AmpftError(Exception):
    """A problem the user can fix (or, for Preempted, an expected stop): reported as one message, no traceback."""

    exit_code = 2
    label = "error"  # the word before the message on stderr


class ConfigError(AmpftError, ValueError):
    """Every problem found in a config, one per line, each naming the key and what would work."""

    what = "the config"

    def __init__(self, problems: list[str]):
        self.problems = problems
        listing = f" {problems[0]}" if len(problems) == 1 else "".join(f"\n  - {p}" for p in problems)
        super().__init__(f"{len(problems)} problem(s) in {self.what}:{listing}")


class BenchmarkConfigError(ConfigError):
    what = "the benchmark config"


class DataError(AmpftError, ValueError):
    """A data file or dataset missing or malformed (the message names the file and line)."""


class ModelLoadError(AmpftError, RuntimeError):
    """A model or tokenizer that cannot be loaded (unreachable Hub, missing folder, ...)."""


class CheckpointError(AmpftError, RuntimeError):
    """A checkpoint not resumable or loadable, or a checkpoint or export not writable (says where the weights are)."""


class EvaluationError(AmpftError, ValueError):
    """A saved run or checkpoint that cannot be evaluated as asked."""


class MissingExtraError(AmpftError, ImportError):
    """An optional library that a feature needs is not installed."""


class TrainingDiverged(AmpftError, RuntimeError):
    """Non-finite or exploding losses, or a collapsed fp16 loss scale: stop, keep the last good checkpoint."""

    exit_code = 3


class Preempted(AmpftError):
    """SIGTERM, SIGUSR1 or a Ctrl-C arrived; a checkpoint was written at the next step boundary."""

    exit_code = 75  # EX_TEMPFAIL: try again (resume with checkpoint.resume=latest)
    label = "preempted"
    marker = "PREEMPTED"  # written into the run dir: make exits 2, `accelerate launch` 1, when the ranks exit 75


def _report(exc: AmpftError) -> None:
    print(f"{exc.label}: {exc}", file=sys.stderr, flush=True)


SWEEP_RECORDER = "ampft.sweep.SweepSummary"  # the Hydra callback that records a multirun's failed jobs


def exit_on_error(main: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a recipe's main function: an AmpftError is written to stderr as `<label>: <message>` and the process
    exits with its code; other exceptions keep their traceback. Under `@hydra.main` (put it below the decorator:
    Hydra unwraps it to find the recipe's file) the job's overrides are checked first (`check_overrides`), and in
    a multirun recorded by SWEEP_RECORDER the error is raised on after its line (the sweep records it)."""

    @functools.wraps(main)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        from omegaconf import DictConfig

        hydra = HydraConfig.get() if HydraConfig.initialized() else None
        try:
            if hydra is not None and args and isinstance(args[0], DictConfig):
                check_overrides(args[0], list(hydra.overrides.task))
            return main(*args, **kwargs)
        except AmpftError as exc:
            _report(exc)
            if hydra is not None and hydra.mode == RunMode.MULTIRUN and any(
                    c.get("_target_") == SWEEP_RECORDER for c in (hydra.callbacks or {}).values()):
                raise
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:  # Ctrl-C before training, or twice during it: no traceback
            print("interrupted (Ctrl-C)", file=sys.stderr, flush=True)
            sys.exit(130)

    return wrapped


_OURS = "AMPFT_HYDRA_FULL_ERROR"  # marks a HYDRA_FULL_ERROR=1 that compose_errors set (children inherit both)


def compose_errors(entry: Callable[[], Any]) -> Callable[[], Any]:
    """Wrap a recipe's `@hydra.main` entry (above the Hydra decorator): a config Hydra cannot compose ends as a
    ConfigError does (one `error:` line, exit 2), in a multirun too. Hydra hands such errors up only under
    HYDRA_FULL_ERROR=1 (else it prints them and exits 1), so that is set here; a user's own
    HYDRA_FULL_ERROR=1 keeps Hydra's full traceback."""

    @functools.wraps(entry)
    def wrapped() -> Any:
        if os.environ.get("HYDRA_FULL_ERROR") == "1" and os.environ.get(_OURS) != "1":
            return entry()
        os.environ.update({"HYDRA_FULL_ERROR": "1", _OURS: "1"})
        try:
            return entry()
        except Exception as exc:
            problem = None if _raised_in_job(exc) else compose_problem(exc)
            if problem is None:
                raise
            _report(ConfigError([problem]))
            sys.exit(ConfigError.exit_code)

    return wrapped


def _raised_in_job(exc: BaseException) -> bool:
    """The exception came from a job's own code (Hydra's `run_job` is on its traceback), not from composing."""
    return any(f.f_code.co_name == "run_job" and "hydra" in f.f_code.co_filename
               for f, _ in traceback.walk_tb(exc.__traceback__))


def _declared(node: Any) -> list[str] | None:
    """The keys a node's schema declares; None for a node of no schema (plain YAML)."""
    kind = node._metadata.object_type
    return [f.name for f in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else None


def _no_such_key(key: str, parent: Any | None, given: str) -> str:
    """`given: no such key`, with the closest keys of `key`'s parent (or, failing any, all of them)."""
    where, _, name = key.rpartition(".")
    keys = [k for k in ([] if parent is None else _declared(parent) or parent) if k not in (name, "hydra")]
    close = difflib.get_close_matches(name, keys, n=3, cutoff=0.6)
    full = [f"{where}.{k}" if where else k for k in close or keys]
    hint = f"did you mean {' or '.join(full)}?" if close else f"the keys{' of ' + where if where else ''}: {', '.join(full)}"
    what = "no such key" if given == key else f"{key} is no key of the config, nothing would read it"
    return f"{given}: {what}; {hint}"


def check_overrides(cfg: Any, overrides: list[str]) -> None:
    """Refuse a key added with `+`/`++` that no schema declares (`+trainer.max_step=3`), which Hydra adds while
    nothing reads it. Open dicts (`+model.arch.x=...`), groups and `hydra.*` are left to Hydra (a group option not
    in conf/<group>/ is its MissingConfigException). Call it inside Hydra's context."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import DictConfig

    loader = GlobalHydra.instance().config_loader()
    problems = []
    for o in OverridesParser.create().parse_overrides(overrides):
        key, node = o.key_or_group, cfg
        parts = key.split(".")
        if not (o.is_add() or o.is_force_add()) or parts[0] == "hydra" or loader.get_group_options(key):
            continue
        for i, part in enumerate(parts):
            if not isinstance(node, DictConfig) or (ref := node._metadata.ref_type) is dict \
                    or typing.get_origin(ref) is dict:  # an open dict (model.arch: transformers kwargs): any key
                break
            declared = _declared(node)
            last = i == len(parts) - 1
            if (declared is not None and part not in declared) or (declared is None and last and o.is_add()):
                problems.append(_no_such_key(".".join(parts[:i + 1]), node, o.input_line))
                break
            node = node._get_node(part)
    if problems:
        raise ConfigError(problems)


def compose_problem(exc: BaseException) -> str | None:
    """A Hydra compose error as one problem line naming the key and what would work; None for any other."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    cause = exc.__cause__
    if isinstance(exc, MissingConfigException) and exc.options is not None:
        group, _, option = exc.missing_cfg_file.partition("/")
        # Hydra offers the group's own files only; the folders of the search path it names hold nested options too
        folders = [Path(p) / group for p in re.findall(r"path=file://(.+)$", str(exc), re.MULTILINE)]
        options = sorted({f.relative_to(d).with_suffix("").as_posix() for d in folders for f in d.rglob("*.yaml")})
        return f"{group}={option}: no such option in conf/{group}/; choose one of {', '.join(options or exc.options)}"
    if isinstance(exc, OverrideParseException):
        return (f"{exc.override}: not an override Hydra can parse ({exc.message.splitlines()[0]}); quote a "
                "value with special characters, e.g. 'task.name=\"a b\"'")
    if isinstance(exc, ConfigCompositionException) and isinstance(cause, OmegaConfBaseException) and cause.full_key:
        if isinstance(cause, ConfigKeyError | ConfigAttributeError):
            return _no_such_key(cause.full_key, cause.parent_node, cause.full_key)
        return f"{cause.full_key}: {str(cause.msg).splitlines()[0]}"
    if isinstance(exc, ConfigCompositionException | MissingConfigException | ValueError):  # e.g. `experiment=null`
        return " ".join(str(exc).split("Config search path")[0].split())
    return None

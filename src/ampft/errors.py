"""The project's errors: one base class, each subclass with the exit code a recipe ends with.

| class                  | raised when                                             | exit code |
|------------------------|---------------------------------------------------------|-----------|
| `ConfigError`          | a config problem (every one found, each naming its key) | 2         |
| `BenchmarkConfigError` | the same in a benchmark or peer-benchmark config        | 2         |
| `DataError`            | a data file or dataset is missing or malformed          | 2         |
| `ModelLoadError`       | a model or tokenizer cannot be loaded (offline Hub, ...) | 2         |
| `CheckpointError`      | a checkpoint cannot be resumed or is unsafe to load     | 2         |
| `EvaluationError`      | a saved run or checkpoint cannot be evaluated           | 2         |
| `MissingExtraError`    | a feature needs an optional library not installed       | 2         |
| `TrainingDiverged`     | non-finite or exploding losses, collapsed fp16 scale    | 3         |
| `Preempted`            | SIGTERM/SIGUSR1: checkpointed, resume later             | 75        |

Every recipe's main function is wrapped by `exit_on_error`, the one place an error becomes an exit code; a
recipe's `@hydra.main` entry by `compose_errors`, which does the same for the errors Hydra raises before the
main function runs.
Each class also keeps the builtin base it had (ValueError, RuntimeError, ImportError), so code that caught
those still does. This module imports nothing from ampft at import time: every other module may import it.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
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
    """Every problem found in a benchmark config (or the peer benchmark's), one per line, each naming the key."""

    what = "the benchmark config"


class DataError(AmpftError, ValueError):
    """A data file or dataset that cannot be read as the task says (the message names the file and line)."""


class ModelLoadError(AmpftError, RuntimeError):
    """A model or tokenizer that cannot be loaded (unreachable Hub, missing folder, ...)."""


class CheckpointError(AmpftError, RuntimeError):
    """A checkpoint that cannot be resumed from (missing, changed config, unsafe content)."""


class EvaluationError(AmpftError, ValueError):
    """A saved run or checkpoint that cannot be evaluated as asked."""


class MissingExtraError(AmpftError, ImportError):
    """An optional library that a feature needs is not installed."""


class TrainingDiverged(AmpftError, RuntimeError):
    """Non-finite or exploding losses, or a collapsed fp16 loss scale: stop, keep the last good checkpoint."""

    exit_code = 3


class Preempted(AmpftError):
    """SIGTERM/SIGUSR1 arrived; a checkpoint was written at the next step boundary."""

    exit_code = 75  # EX_TEMPFAIL: try again (resume with checkpoint.resume=latest)
    label = "preempted"
    marker = "PREEMPTED"  # written into the run dir: `accelerate launch` exits 1 when its ranks exit 75


def exit_on_error(main: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a recipe's main function: an AmpftError is written to stderr as `<label>: <message>` and the
    process exits with the error's code; any other exception keeps its traceback. Under `@hydra.main`,
    put it below the Hydra decorator (Hydra unwraps it to find the recipe's file)."""

    @functools.wraps(main)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            _check_hydra_overrides(args)
            return main(*args, **kwargs)
        except AmpftError as exc:
            print(f"{exc.label}: {exc}", file=sys.stderr, flush=True)
            sys.exit(exc.exit_code)

    return wrapped


def _check_hydra_overrides(args: tuple[Any, ...]) -> None:
    """Under `@hydra.main` (a composed config as the argument): the job's overrides, checked for keys and
    options Hydra lets through although nothing reads them (`ampft.config.check_overrides`)."""
    if "hydra" not in sys.modules or not args:
        return
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig

    if isinstance(args[0], DictConfig) and HydraConfig.initialized():
        from ampft.config import check_overrides

        check_overrides(args[0], list(HydraConfig.get().overrides.task))


_OURS = "AMPFT_HYDRA_FULL_ERROR"  # marks a HYDRA_FULL_ERROR=1 that compose_errors set (children inherit both)


def compose_errors(entry: Callable[[], Any]) -> Callable[[], Any]:
    """Wrap a recipe's `@hydra.main` entry (put it above the Hydra decorator): a config Hydra cannot compose (a
    misspelt key, an option not in conf/<group>/, a value of the wrong type, an override it cannot parse) ends
    as a ConfigError does, one `error:` line naming the key and what would work, exit 2, in a multirun too.
    Hydra itself prints such errors and exits 1; it hands them up only under HYDRA_FULL_ERROR=1, so that is set
    here (an error of the recipe's own then shows its full traceback, exit 1, as without). A user's own
    HYDRA_FULL_ERROR=1 keeps Hydra's full traceback for compose errors too."""

    @functools.wraps(entry)
    def wrapped() -> Any:
        if os.environ.get("HYDRA_FULL_ERROR") == "1" and os.environ.get(_OURS) != "1":
            return entry()
        os.environ.update({"HYDRA_FULL_ERROR": "1", _OURS: "1"})
        try:
            return entry()
        except Exception as exc:
            from ampft.config import compose_problem

            problem = None if _raised_in_job(exc) else compose_problem(exc)
            if problem is None:
                raise
            error = ConfigError([problem])
            print(f"{error.label}: {error}", file=sys.stderr, flush=True)
            sys.exit(error.exit_code)

    return wrapped


def _raised_in_job(exc: BaseException) -> bool:
    """Whether the exception came from a job's own code (Hydra's `run_job` is on its traceback), not from
    composing its config."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "run_job" and "hydra" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False

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

Every recipe's main function is wrapped by `exit_on_error`, the one place an error becomes an exit code (in a
multirun recorded by `ampft.sweep`, the sweep's: each job's error is recorded there and the sweep goes on).
Each class also keeps the builtin base it had (ValueError, RuntimeError, ImportError), so code that caught
those still does. This module imports nothing from ampft: every other module may import it.
"""

from __future__ import annotations

import functools
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
        super().__init__(
            f"{len(problems)} problem(s) in {self.what}:\n" + "\n".join(f"  - {p}" for p in problems)
        )


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


SWEEP_RECORDER = "ampft.sweep.SweepSummary"  # the Hydra callback that records a multirun's failed jobs


def _in_recorded_sweep() -> bool:
    """Inside a job of a Hydra multirun whose config records each job (`hydra.callbacks` has SWEEP_RECORDER)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
    except ImportError:
        return False
    if not HydraConfig.initialized():
        return False
    hydra = HydraConfig.get()
    return hydra.mode == RunMode.MULTIRUN and any(
        c.get("_target_") == SWEEP_RECORDER for c in (hydra.callbacks or {}).values())


def exit_on_error(main: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a recipe's main function: an AmpftError is written to stderr as `<label>: <message>` and the
    process exits with the error's code; any other exception keeps its traceback. In a job of a multirun that
    records its jobs (ampft.sweep) the error is raised on after its line instead: the sweep records it and
    goes on with the next job. Under `@hydra.main`, put it below the Hydra decorator (Hydra unwraps it to find
    the recipe's file)."""

    @functools.wraps(main)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return main(*args, **kwargs)
        except AmpftError as exc:
            print(f"{exc.label}: {exc}", file=sys.stderr, flush=True)
            if _in_recorded_sweep():
                raise
            sys.exit(exc.exit_code)

    return wrapped

"""Optional libraries (pyproject.toml extras), imported inside the function that needs them, so fine-tuning
and the benchmark run on the core dependencies alone; a missing one is a `MissingExtraError` naming the
feature and the pip command."""

from __future__ import annotations

import importlib
from types import ModuleType

from ampft.errors import MissingExtraError

# extra -> the pip packages it installs (the same lists as [project.optional-dependencies]).
EXTRAS = {"metrics": "scikit-learn scipy", "plots": "matplotlib", "tensorboard": "tensorboard"}


def require(module: str, extra: str, feature: str) -> ModuleType:
    """`module`, imported; or a MissingExtraError saying which feature needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{feature} needs {module.split('.')[0]!r}, which is not installed ({exc}). Install the "
            f"{extra!r} extra: pip install 'ampft[{extra}]' (from a checkout: pip install -e '.[{extra}]', "
            f"or pip install {EXTRAS[extra]}); `make setup` installs every extra."
        ) from exc

"""ampft: Hydra-composed fine-tuning recipes for Transformers on Accelerate, with mixed precision done right."""

__version__ = "0.1.0"

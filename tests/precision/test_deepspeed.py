"""The DeepSpeed precision section is generated from the precision group's keys: never set twice."""

from __future__ import annotations

import pytest

from ampft.config import ConfigError
from ampft.precision import deepspeed_mode, deepspeed_section
from ampft.validation import validate


def test_fp16_section_from_the_loss_scaling_keys(compose):
    cfg = compose(["precision=fp16", "precision.init_scale=1024", "precision.growth_interval=500",
                   "precision.hysteresis=2", "precision.min_scale=4"])
    section, caveats = deepspeed_section(cfg.precision)
    assert section == {
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 10, "loss_scale_window": 500,
                 "hysteresis": 2, "min_loss_scale": 4.0},
        "bf16": {"enabled": False},
    }
    assert caveats == []


def test_static_scale_and_what_deepspeed_cannot_honour(compose):
    cfg = compose(["precision=fp16", "precision.static_scale=128", "precision.init_scale=1000",
                   "precision.growth_factor=4"])
    section, caveats = deepspeed_section(cfg.precision)
    assert section["fp16"]["loss_scale"] == 128.0
    assert section["fp16"]["initial_scale_power"] == 10
    assert any("power of two" in c for c in caveats) and any("x2" in c for c in caveats)


def test_bf16_and_fp32_sections(compose):
    # bf16 means autocast with fp32 weights and gradients, as on every other backend (fp32 gradient reduction)
    assert deepspeed_section(compose(["precision=bf16"]).precision)[0] == {
        "fp16": {"enabled": False}, "bf16": {"enabled": False},
        "torch_autocast": {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}}
    # ... or DeepSpeed's own bf16 mode (16-bit weights and gradients), when asked for
    assert deepspeed_section(compose(["precision=bf16"]).precision, "half")[0] == {
        "fp16": {"enabled": False}, "bf16": {"enabled": True}}
    for name in ("fp32", "tf32"):
        assert deepspeed_section(compose([f"precision={name}"]).precision)[0] == {
            "fp16": {"enabled": False}, "bf16": {"enabled": False}}


def test_deepspeed_precision_mode_per_precision(compose):
    mode = lambda prec, m="auto": deepspeed_mode(compose([f"precision={prec}"]).precision, m)  # noqa: E731
    assert (mode("bf16"), mode("fp16"), mode("fp32"), mode("tf32")) == ("autocast", "half", None, None)
    assert (mode("bf16", "half"), mode("fp16", "half")) == ("half", "half")


def test_deepspeed_fp16_autocast_is_refused_with_the_fix(compose):
    with pytest.raises(ConfigError) as err:
        validate(compose(["distributed=deepspeed-z2", "precision=fp16", "distributed.deepspeed_precision=autocast"]))
    assert "distributed.deepspeed_precision=auto" in str(err.value)
    validate(compose(["distributed=deepspeed-z2", "precision=bf16", "distributed.deepspeed_precision=half"]))

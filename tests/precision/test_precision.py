"""The precision group maps onto Accelerate/torch as documented, and a run never silently changes precision."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState

from ampft import devices, precision
from ampft.config import ConfigError
from ampft.validation import validate


@pytest.fixture(autouse=True)
def _fresh_accelerator_state():
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.mark.parametrize("name", ["fp32", "tf32"])
def test_fp32_and_tf32_run_without_autocast_or_loss_scaling(compose, name):
    """The Accelerator the group builds computes in float32 exactly (on a CPU tf32 is fp32); fp16 and bf16 are
    observed in their own tests below."""
    cfg = compose([f"precision={name}"])
    acc = Accelerator(**precision.accelerator_kwargs(cfg.precision), cpu=True)
    assert precision.setup(acc, cfg.precision) == "fp32"
    assert acc.scaler is None
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64)
    x = torch.randn(4, 64)
    exact = layer(x)
    assert torch.equal(acc.prepare(layer)(x), exact)


def test_fp32_switches_tf32_off_explicitly(compose):
    precision.set_tf32(True)
    assert precision.tf32_enabled()
    cfg = compose(["precision=fp32"])
    acc = Accelerator(**precision.accelerator_kwargs(cfg.precision))
    assert precision.setup(acc, cfg.precision) == "fp32"
    assert not precision.tf32_enabled()
    if precision._fp32_precision_api():  # torch >= 2.9: only the new switches are used (never mixed)
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        assert torch.backends.cudnn.conv.fp32_precision == torch.backends.cudnn.rnn.fp32_precision == "ieee"
    else:
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch < 2.9")
def test_tf32_uses_the_new_switches_and_never_a_legacy_one(monkeypatch):
    legacy = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda value: legacy.append(value))
    for enabled, mode in ((True, "tf32"), (False, "ieee")):
        precision.set_tf32(enabled)
        assert torch.backends.cuda.matmul.fp32_precision == mode
        assert torch.backends.cudnn.conv.fp32_precision == torch.backends.cudnn.rnn.fp32_precision == mode
        assert precision.tf32_enabled() is enabled
    assert legacy == []


def test_tf32_falls_back_to_the_legacy_flags_on_older_torch(monkeypatch):
    """torch < 2.9: no fp32_precision attributes; allow_tf32 and set_float32_matmul_precision are the switches."""
    from types import SimpleNamespace

    matmul, cudnn, calls = SimpleNamespace(allow_tf32=False), SimpleNamespace(allow_tf32=False), []
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    monkeypatch.setattr(torch.backends, "cudnn", cudnn)
    monkeypatch.setattr(torch, "set_float32_matmul_precision", calls.append)
    assert not precision._fp32_precision_api()
    precision.set_tf32(True)
    assert matmul.allow_tf32 and cudnn.allow_tf32 and calls == ["high"] and precision.tf32_enabled()
    precision.set_tf32(False)
    assert not matmul.allow_tf32 and not cudnn.allow_tf32 and calls == ["high", "highest"]
    assert not precision.tf32_enabled()


def test_tf32_without_tensor_cores_runs_as_fp32_and_says_so(compose):
    cfg = compose(["precision=tf32"])
    _, warnings = precision.preflight(cfg)
    if torch.cuda.is_available() and precision.tf32_supported():
        pytest.skip("this machine has TF32")
    assert any("runs as plain fp32" in w for w in warnings)
    acc = Accelerator(**precision.accelerator_kwargs(cfg.precision))
    assert precision.setup(acc, cfg.precision) == "fp32"


def test_fp16_scaler_gets_the_precision_keys(compose):
    cfg = compose(["precision=fp16", "precision.init_scale=1024", "precision.growth_interval=7",
                   "precision.backoff_factor=0.25", "precision.growth_factor=4"])
    acc = Accelerator(**precision.accelerator_kwargs(cfg.precision), cpu=True)
    assert precision.setup(acc, cfg.precision) == "fp16"
    scaler = acc.scaler
    assert isinstance(scaler, torch.amp.GradScaler)
    assert (scaler.get_scale(), scaler.get_growth_interval(), scaler.get_backoff_factor(),
            scaler.get_growth_factor()) == (1024.0, 7, 0.25, 4.0)


def test_fp16_on_cpu_is_real_fp16_not_silent_fp32(compose):
    """Accelerate alone would run fp32 here; the run must compute in float16 under autocast."""
    cfg = compose(["precision=fp16"])
    acc = Accelerator(**precision.accelerator_kwargs(cfg.precision), cpu=True)
    precision.setup(acc, cfg.precision)
    _assert_computed_in(acc, torch.float16)


def test_bf16_autocast_on_cpu(compose):
    cfg = compose(["precision=bf16"])
    acc = Accelerator(**precision.accelerator_kwargs(cfg.precision), cpu=True)
    assert precision.setup(acc, cfg.precision) == "bf16"
    assert acc.scaler is None  # bf16 needs no loss scaling
    _assert_computed_in(acc, torch.bfloat16)


def _assert_computed_in(acc, dtype):
    """Accelerate hands outputs back as fp32; their values show the dtype the matmul ran in."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64)
    x = torch.randn(4, 64)
    exact = layer(x)
    out = acc.prepare(layer)(x)
    assert torch.equal(out, out.to(dtype).float()), f"output is not representable in {dtype}"
    assert not torch.equal(out, exact)
    torch.testing.assert_close(out, exact, atol=0.05, rtol=0.05)


def test_precision_mismatch_is_refused(compose):
    cfg = compose(["precision=bf16"])
    acc = Accelerator(mixed_precision="no", cpu=True)  # e.g. a launcher config that disagrees
    with pytest.raises(RuntimeError, match="precision=bf16 was requested"):
        precision.setup(acc, cfg.precision)


def test_bad_loss_scaling_keys_are_config_errors(compose):
    from ampft.config import ConfigError

    cfg = compose(["precision=fp16", "precision.backoff_factor=1.5", "precision.max_consecutive_nonfinite=0"])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    text = str(err.value)
    assert "backoff_factor=1.5" in text and "max_consecutive_nonfinite=0" in text


# /proc/cpuinfo excerpts (one processor each) of the two kinds of development CPU
XEON = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu vme sse sse2 avx avx2 f16c avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile
bugs\t\t: spectre_v1
"""
EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu vme sse sse2 avx avx2 f16c fma
"""


def test_cpu_flags_are_read_from_cpuinfo():
    assert {"avx512_fp16", "amx_bf16", "amx_tile", "avx2"} <= precision.cpu_flags(XEON)
    assert "avx512_fp16" not in precision.cpu_flags(EPYC) and "avx2" in precision.cpu_flags(EPYC)
    assert precision.cpu_flags("processor\t: 0\nmodel name\t: ARM\n") == set()  # no flags line
    assert devices.cpu_half_support(precision.cpu_flags(XEON)) == {"fp16": ["avx512_fp16"],
                                                                     "bf16": ["avx512_bf16", "amx_bf16"]}
    assert devices.cpu_half_support(precision.cpu_flags(EPYC)) == {"fp16": [], "bf16": []}
    assert devices.cpu_half_support({"amx_fp16", "avx512_bf16"}) == {"fp16": ["amx_fp16"], "bf16": ["avx512_bf16"]}
    assert precision.cpu_flags() == precision.cpu_flags(Path("/proc/cpuinfo").read_text())  # this machine


def test_cpu_name_is_read_from_cpuinfo_by_the_one_reader():
    assert devices.cpu_name(EPYC) == "AMD EPYC"
    assert devices.cpu_name("processor\t: 0\n") == (platform.processor() or platform.machine())  # no model name
    assert devices.cpu_name() == devices.cpu_name(Path("/proc/cpuinfo").read_text())  # this machine


@pytest.mark.parametrize("cpuinfo,says", [
    (XEON, ["this CPU has avx512_fp16, so fp16 autocast runs at about fp32's speed, not faster",
            "bf16 has avx512_bf16 and amx_bf16 here, the fast CPU path"]),
    (EPYC, ["this CPU has neither AVX512-FP16 nor AMX-FP16, so fp16 autocast runs many times slower than fp32",
            "bf16 has no AVX512-BF16/AMX-BF16 here either"]),
])
def test_fp16_on_cpu_warning_names_what_decides_its_speed(compose, monkeypatch, cpuinfo, says):
    flags = precision.cpu_flags(cpuinfo)
    monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo=None: flags)
    errors, warnings = precision.preflight(compose(["precision=fp16", "trainer.cpu=true"]))
    assert not errors
    (w,) = [w for w in warnings if w.startswith("precision=fp16 on CPU")]
    for text in says:
        assert text in w
    assert "docs/benchmarks/README.md#fp16-and-bf16-speed-by-kind-of-cpu" in w and "precision=bf16" in w
    assert "0.92" not in w and "1.57" not in w  # measured figures live in the docs, per CPU


@pytest.mark.parametrize("cpuinfo,warned", [(XEON, False), (EPYC, True)])
def test_bf16_on_a_cpu_without_native_bf16_warns_that_it_is_slow(compose, monkeypatch, cpuinfo, warned):
    flags = precision.cpu_flags(cpuinfo)
    monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo=None: flags)
    errors, warnings = precision.preflight(compose(["precision=bf16", "trainer.cpu=true"]))
    slow = [w for w in warnings if w.startswith("precision=bf16 on a CPU without AVX512-BF16 or AMX-BF16")]
    assert not errors and len(slow) == warned
    if warned:
        assert "precision=fp32" in slow[0] and "docs/benchmarks/README.md#fp16-and-bf16-speed-by-kind-of-cpu" in slow[0]
    assert not any("precision=bf16 on a CPU" in w for w in precision.preflight(compose(["precision=fp32"]))[1])


@pytest.mark.parametrize(("told", "precision", "refused"), [
    ("bf16", "fp32", True), ("fp16", "bf16", True), ("fp8", "bf16", True), ("bf16", "bf16", False),
    ("fp16", "fp16", False), ("no", "bf16", False), ("no", "tf32", False),  # `no`: what accelerate launch sets untold
])
def test_a_launcher_precision_other_than_the_groups_is_refused(compose, monkeypatch, told, precision, refused):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", told)
    cfg = compose([f"precision={precision}"])
    if not refused:
        validate(cfg)
        return
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    (problem,) = [p for p in err.value.problems if "Accelerate was told" in p]
    assert f"mixed_precision={told}" in problem and f"precision={precision}" in problem
    assert (f"pass precision={told}" in problem) == (told in ("fp16", "bf16"))

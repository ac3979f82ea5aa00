"""The hardware and software a benchmark ran on, for the report."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import time
from contextlib import suppress
from pathlib import Path

import accelerate
import torch
import transformers

from ampft.devices import cpu_features, cpu_name


def _nvidia_driver() -> str | None:
    with suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.strip()
        return out.splitlines()[0] if out else None
    with suppress(OSError):
        return Path("/proc/driver/nvidia/version").read_text().partition("\n")[0].strip()
    return None


def _load() -> float | None:
    with suppress(OSError):
        return round(os.getloadavg()[0], 2)
    return None


def describe(device: torch.device) -> dict:
    cuda = device.type == "cuda"
    props = torch.cuda.get_device_properties(device) if cuda else None
    return dict(
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), device_type=device.type,
        device_name=torch.cuda.get_device_name(device) if cuda else cpu_name(),
        device_memory_bytes=props.total_memory if cuda else None,
        compute_capability=f"{props.major}.{props.minor}" if cuda else None,
        driver=_nvidia_driver() if cuda else None, cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if cuda else None, cpu=cpu_name(), cpu_count=os.cpu_count(),
        cpu_features=cpu_features(), torch_threads=torch.get_num_threads(),
        load_average=_load(),  # other processes on the machine make timings noisy
        python=platform.python_version(), os=f"{platform.system()} {platform.release()}",
        torch=torch.__version__, transformers=transformers.__version__, accelerate=accelerate.__version__)


def _busy_seconds() -> float | None:
    """CPU seconds the whole machine spent busy since boot (Linux /proc/stat), all cores together."""
    with suppress(OSError, ValueError):  # user nice system idle iowait irq softirq steal
        ticks = [int(x) for x in Path("/proc/stat").read_text().partition("\n")[0].split()[1:]] + [0] * 8
        return (sum(ticks[:3]) + sum(ticks[5:8])) / os.sysconf("SC_CLK_TCK")
    return None


class OtherLoad:
    """The share of the machine's CPU capacity that other processes used while a block ran: 0 on a quiet
    machine; 0.5 on 2 cores means another process kept one core busy (timings are then unreliable). This
    process's own children that finished inside the block (a benchmark arm run as a subprocess) count as own."""

    def __enter__(self) -> OtherLoad:
        self.share: float | None = None
        self._t, self._busy, self._own = time.monotonic(), _busy_seconds(), sum(os.times()[:4])
        return self

    def __exit__(self, *exc) -> None:
        busy, elapsed = _busy_seconds(), time.monotonic() - self._t
        if busy is not None and self._busy is not None and elapsed > 0:
            other = (busy - self._busy) - (sum(os.times()[:4]) - self._own)
            self.share = round(min(max(other / (elapsed * (os.cpu_count() or 1)), 0.0), 1.0), 3)

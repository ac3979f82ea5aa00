"""torch.profiler over a window of training steps, the same way for both runners (`benchmark.accuracy.profile_steps`,
docs/benchmarks/README.md, "Profile"): a global optimizer step hook advances the schedule, so neither training
loop is touched; a global forward pre-hook counts the window's tokens at the word embedding, padded and real.
`summary` sorts the ops' self time (CUDA's where there is one) into categories, per step and per 1,000 real tokens.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path

import torch
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

SKIP, WARMUP = 5, 2  # steps before the recorded window: one-time costs, then the profiler's own warm-up
TOP = 12  # ops listed per arm

# Op name → category, first match wins (aten names; mkldnn/onednn kernels are matmuls on CPU).
CATEGORIES = (
    ("attention", ("scaled_dot_product", "flash_attention", "efficient_attention", "softmax")),
    ("layer norm", ("layer_norm",)),
    ("gradient norm", ("_foreach_norm", "linalg_vector_norm", "clip_grad", "aten::norm")),
    ("matmul", ("addmm", "aten::mm", "bmm", "matmul", "linear", "mkldnn", "onednn")),
    ("optimizer", ("adam", "_foreach_", "lerp", "addcdiv", "addcmul")),
    ("dtype casts", ("_to_copy", "aten::copy_", "aten::to", "autocast")),
    ("embedding", ("embedding",)),
    ("dropout", ("dropout", "bernoulli")),
)


def category(op: str) -> str:
    name = op.lower()
    return next((c for c, keys in CATEGORIES if any(k in name for k in keys)), "other")


class StepProfiler(contextlib.ExitStack):
    """`with StepProfiler(steps) as p: <train>`; then `p.save(out_dir)`."""

    def __init__(self, steps: int):
        super().__init__()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.prof = profile(activities=activities,
                            schedule=schedule(skip_first=SKIP, wait=0, warmup=WARMUP, active=steps, repeat=1))
        self.recorded = 0  # optimizer steps inside the recorded window
        self.padded = self.real = 0

    def __enter__(self) -> StepProfiler:
        self.enter_context(self.prof)
        self.callback(register_optimizer_step_post_hook(self._step).remove)
        self.callback(register_module_forward_pre_hook(self._count).remove)
        return self

    def _recording(self) -> bool:
        return self.prof.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)

    def _step(self, optimizer, args, kwargs) -> None:
        if self._recording():
            self.recorded += 1
        self.prof.step()

    def _count(self, module: torch.nn.Module, args: tuple) -> None:
        # The word embedding: the training-mode nn.Embedding that knows the padding id, called with the ids.
        if (isinstance(module, torch.nn.Embedding) and module.training and module.padding_idx is not None
                and args and self._recording()):
            ids = args[0]
            self.padded += ids.numel()
            self.real += int((ids != module.padding_idx).sum())

    def summary(self) -> dict:
        """Per recorded step: self time by category and the top ops (ms), tokens; empty if the run was too
        short to reach the window."""
        if not self.recorded:
            return dict(steps=0, note=f"the run had fewer than {SKIP + WARMUP + 1} optimizer steps: nothing recorded")
        n, cuda, by_cat, ops = self.recorded, torch.cuda.is_available(), Counter(), []
        for e in self.prof.key_averages():
            if e.key.startswith("ProfilerStep"):
                continue
            ms = e.self_cpu_time_total / 1e3 / n
            gpu = getattr(e, "self_device_time_total", 0) / 1e3 / n if cuda else None
            cat = category(e.key)
            by_cat[cat] += gpu if cuda else ms
            ops.append(dict(op=e.key, category=cat, cpu_ms=ms, gpu_ms=gpu, calls=e.count / n))
        ops.sort(key=lambda o: -(o["gpu_ms"] if cuda else o["cpu_ms"]))
        total = sum(by_cat.values())
        return dict(steps=n, clock="CUDA kernel time" if cuda else "CPU self time", ms_per_step=total,
                    padded_tokens_per_step=self.padded / n, real_tokens_per_step=self.real / n,
                    ms_per_1k_real_tokens=1e3 * total / max(self.real / n, 1),
                    categories=dict(by_cat.most_common()), top=ops[:TOP])

    def save(self, out_dir: Path) -> dict:
        """profile.txt (torch's table of the window) in out_dir; returns `summary()`."""
        sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        table = self.prof.key_averages().table(sort_by=sort, row_limit=40) if self.recorded else "nothing recorded\n"
        (Path(out_dir) / "profile.txt").write_text(table)
        return self.summary()

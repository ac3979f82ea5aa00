"""One training step of the composed recipe's real model, traced on fake tensors: what it keeps, what it computes.

The engine's step, on a model built inside a `FakeTensorMode` (docs/architecture.md, docs/benchmarks/estimate.md:
what is counted, and how `CudaPolicy` has CPU autocast save CUDA's dtypes, since a fake CUDA device does not trace
on a CPU-only torch build).
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils import flop_counter as fc
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from ampft.tasks.base import Family

aten = torch.ops.aten

HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}

# The CUDA autocast fp32 list (torch.amp docs, "CUDA Ops that can autocast to float32") as Python functions, for
# the ops that CPU autocast does not also put in its fp32 list (the losses are in both).
CUDA_FP32_FUNCS = frozenset(getattr(space, name) for space, names in (
    (F, "layer_norm group_norm softmax log_softmax softmin softplus normalize cosine_similarity"),
    (torch, "softmax log_softmax exp expm1 log log1p log2 log10 pow rsqrt reciprocal sum cumsum cumprod prod norm "
            "erfinv acos asin cosh sinh tan dist cdist renorm"),
    (torch.Tensor, "softmax log_softmax exp log pow __pow__ __rpow__ rsqrt reciprocal sum cumsum prod norm "
                   "__rtruediv__"),
) for name in names.split())


class CudaPolicy(TorchFunctionMode):
    """CUDA's autocast on CPU fake tensors: CUDA's fp32-list ops run in fp32, and SDPA without dropout (CPU's flash
    kernel keeps what CUDA's kernels do; with dropout CPU falls back to the math path: docs/benchmarks/estimate.md)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            if len(args) > 4:
                args = (*args[:4], 0.0, *args[5:])
            else:
                kwargs = {**kwargs, "dropout_p": 0.0}
        if func in CUDA_FP32_FUNCS and torch.is_autocast_enabled("cpu"):
            def up(x):
                return x.float() if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16) else x
            args, kwargs = tree_map(up, (args, kwargs))
        return func(*args, **kwargs)


# CPU's fused attention kernels are absent from torch's formula table; they compute what the CUDA ones do (on
# shapes, as FlopCounterMode's custom_mapping takes them).
EXTRA_FLOPS = {
    aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *_, **__: fc.sdpa_flop_count(q, k, v),
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda g, q, k, v, *_, **__: fc.sdpa_backward_flop_count(g, q, k, v),
}
# FlopCounterMode's formulas per op (torch's table with the above), applied op by op: the roofline needs each op's
# FLOPs, not the total. Entering FlopCounterMode itself would double a trace's time (its module tracking).
FLOP_FORMULAS = fc.FlopCounterMode(display=False, custom_mapping=EXTRA_FLOPS).flop_registry


@dataclass
class Phase:
    """One part of the step: peak of the storages alive (on top of those alive before it, which the caller adds),
    their categories at that peak, FLOPs, and per-op (flops, bytes, dtype) for the roofline."""

    peak: int = 0
    at_peak: dict[str, int] = field(default_factory=dict)
    flops: int = 0
    ops: list[tuple[int, int, str]] = field(default_factory=list)
    # After each op: (bytes alive that do not grow with the batch, bytes that do: first dimension B or B x L), so
    # the peak at another batch size is the max over this timeline with the second part rescaled.
    timeline: list[tuple[int, int]] = field(default_factory=list)

    def peak_at(self, scale: float) -> float:
        """The phase's peak with every per-sample storage `scale` times as large (a batch `scale` times as big)."""
        return max((c + b * scale for c, b in self.timeline), default=float(self.peak))


class _Live(TorchDispatchMode):
    """Every storage created by an op, by category, while alive; the peak of their sum; per-op FLOPs and bytes."""

    def __init__(self, params: set[int], batch_size: int, seq_len: int):
        super().__init__()
        self.params = params  # ids of the parameters' storages (resident before the step; not counted here)
        self.leading = {batch_size, batch_size * seq_len}  # first dimensions of per-sample tensors: [B, ...], [B*L, ...]
        self.live: dict[int, list] = {}  # id(storage) -> [nbytes, category, per_sample]
        self.by_cat: Counter = Counter()
        self.per_sample = 0
        self.phase = Phase()

    @property
    def total(self) -> int:
        return sum(self.by_cat.values())

    def new_phase(self) -> Phase:
        self.phase = Phase(peak=self.total, at_peak=dict(+self.by_cat))
        return self.phase

    def _count(self, entry: list, sign: int) -> None:
        self.by_cat[entry[1]] += sign * entry[0]
        self.per_sample += sign * entry[0] * entry[2]

    def tag(self, t: torch.Tensor, category: str) -> None:
        """Recategorize a temporary storage (as activations, gradients)."""
        entry = self.live.get(id(t.untyped_storage()))
        if entry is not None and entry[1] == "temporary":
            self._count(entry, -1)
            # a gradient whose first dimension happens to be the batch is not per-sample
            entry[1:] = category, entry[2] and category != "gradients"
            self._count(entry, 1)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        outs = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
        cast_of_weight = func.overloadpacket is aten._to_copy and ins and id(ins[0].untyped_storage()) in self.params
        new = 0
        for t in outs:
            s = t.untyped_storage()
            if (key := id(s)) in self.live or key in self.params:
                continue
            entry = self.live[key] = [s.nbytes(), "weight_casts" if cast_of_weight else "temporary",
                                      t.dim() > 0 and t.shape[0] in self.leading and not cast_of_weight]
            weakref.finalize(s, lambda key=key: self._count(self.live.pop(key), -1))
            self._count(entry, 1)
            new += entry[0]
        ph, total = self.phase, self.total
        ph.timeline.append((total - self.per_sample, self.per_sample))
        if total > ph.peak:
            ph.peak, ph.at_peak = total, dict(+self.by_cat)
        if not func.is_view:
            formula = FLOP_FORMULAS.get(func.overloadpacket)
            flops = int(formula(*args, **kwargs, out_val=out)) if formula else 0
            ph.flops += flops
            dtype = str(ins[0].dtype if ins else (outs[0].dtype if outs else "")).removeprefix("torch.")
            ph.ops.append((flops, sum(t.numel() * t.element_size() for t in ins) + new, dtype))  # read, write once
        return out


@dataclass
class StepTrace:
    """One traced training step; bytes unless named otherwise."""

    precision: str
    batch_size: int
    params: int
    trainable_params: int
    weights: int  # parameters and buffers, resident
    gradients: int
    optimizer_state: int
    saved_activations: int  # storages saved for backward at the end of the forward pass, once each
    saved_weight_casts: int  # low-precision copies of weights saved for backward
    saved_by_dtype: dict[str, int]
    forward_backward: Phase
    optimizer_step: Phase
    largest_block_params: int  # one transformer layer (what FSDP / ZeRO-3 gather at a time)
    seconds: float
    # Layers whose forward the backward pass recomputed (model.gradient_checkpointing); 0: none. Their FLOPs and
    # temporaries are in `forward_backward`; only their inputs are in `saved_activations`.
    checkpointed_layers: int = 0

    @property
    def flops(self) -> int:
        return self.forward_backward.flops + self.optimizer_step.flops


def fake_mode() -> FakeTensorMode:
    return FakeTensorMode(allow_non_fake_inputs=True)


def fake_batch(family: Family, batch_size: int, seq_len: int, vocab: int) -> dict:
    """A batch of model inputs and the family's training targets (made inside the fake mode: shapes only)."""
    shape = (batch_size, seq_len)
    return dict(input_ids=torch.randint(0, vocab, shape), attention_mask=torch.ones(shape, dtype=torch.long),
                token_type_ids=torch.zeros(shape, dtype=torch.long)) | family.fake_targets(batch_size, seq_len)


def largest_block(model: torch.nn.Module) -> int:
    """Parameters of one transformer layer (the element of the model's largest list of identical modules)."""
    def size(m: torch.nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    return max(map(size, max(lists, key=size))) if lists else size(model)


def _checkpointed(model: torch.nn.Module, keep, target: str, calls: list, undo: contextlib.ExitStack) -> None:
    """model.gradient_checkpointing: `keep` counts each checkpointed layer's inputs as saved, `calls` gets one entry
    per checkpointed forward, and for a CUDA target `CudaPolicy` is the `context_fn` (torch's checkpoint replays
    autocast, not torch-function modes). `undo` puts each module's own checkpoint function back."""
    for mod in model.modules():
        func = getattr(mod, "_gradient_checkpointing_func", None)
        if func is None or not getattr(mod, "gradient_checkpointing", False):
            continue
        undo.callback(setattr, mod, "_gradient_checkpointing_func", func)

        def traced(fn, *args, _func=func, **kwargs):
            calls.append(1)
            for t in args:
                if isinstance(t, torch.Tensor):
                    keep(t)
            if target == "cuda":
                kwargs["context_fn"] = lambda: (contextlib.nullcontext(), CudaPolicy())
            return _func(fn, *args, **kwargs)

        mod._gradient_checkpointing_func = traced


def _nbytes(tensors) -> int:
    """Bytes of the distinct storages under `tensors`."""
    return sum(s.nbytes() for s in {id(t.untyped_storage()): t.untyped_storage() for t in tensors}.values())


def trace_step(model: torch.nn.Module, batch: dict, precision: str, target: str = "cuda",
               make_optimizer=None, max_grad_norm: float = 1.0, mode=None) -> StepTrace:
    """Trace forward + backward (+ clipping and the step of `make_optimizer(model)`'s optimizer, if given) of `model`
    on `batch`, both made inside `mode` (the FakeTensorMode), or real with mode=None (how the tests check the
    counting against real memory)."""
    started = time.perf_counter()
    params = list(model.parameters())
    model.zero_grad(set_to_none=True)  # the step starts as the engine's do
    resident = {id(t.untyped_storage()) for t in [*params, *model.buffers()]}
    weights = _nbytes([*params, *model.buffers()])
    live = _Live(resident, *map(int, batch["input_ids"].shape[:2]))
    seen, saved = set(resident), Counter()  # bytes saved for backward by dtype, and the weight casts

    def pack(t: torch.Tensor):
        if (key := id(t.untyped_storage())) not in seen:
            seen.add(key)
            cast = live.live.get(key, [0, "temporary"])[1] == "weight_casts"
            saved["weight_casts" if cast else str(t.dtype).removeprefix("torch.")] += t.untyped_storage().nbytes()
            live.tag(t, "activations")
        return t

    recomputed: list = []
    null = contextlib.nullcontext()
    autocast = torch.autocast("cpu", dtype=HALF[precision]) if precision in HALF else null
    state = 0
    with contextlib.ExitStack() as undo:  # the model as it was, whatever happens
        undo.callback(model.zero_grad, set_to_none=True)
        _checkpointed(model, pack, target, recomputed, undo)
        for p in params:
            if p.requires_grad:
                undo.callback(p.register_post_accumulate_grad_hook(lambda p: live.tag(p.grad, "gradients")).remove)
        with mode if mode is not None else null:
            opt = make_optimizer(model) if make_optimizer else None
            model.train()
            with live:
                with (torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast,
                      CudaPolicy() if target == "cuda" else null):
                    loss = model(**batch).loss
                by_dtype = saved.copy()
                loss.backward()
                del loss
                fwd_bwd = live.phase
                grads = _nbytes(p.grad for p in params if p.grad is not None)
                step_phase = live.new_phase()
                if opt is not None:
                    if max_grad_norm > 0:
                        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
                    opt.step()
                    state = _nbytes(t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor))
                    opt.zero_grad(set_to_none=True)
    casts = by_dtype.pop("weight_casts", 0)
    return StepTrace(
        precision=precision, batch_size=int(batch["input_ids"].shape[0]), params=sum(p.numel() for p in params),
        trainable_params=sum(p.numel() for p in params if p.requires_grad), weights=weights, gradients=grads,
        optimizer_state=state, saved_activations=sum(by_dtype.values()), saved_weight_casts=casts,
        saved_by_dtype=dict(by_dtype), forward_backward=fwd_bwd, optimizer_step=step_phase,
        largest_block_params=largest_block(model),
        seconds=time.perf_counter() - started, checkpointed_layers=len(recomputed),
    )

"""The fake trace: counts what a step keeps, exactly on a model small enough to count by hand, and uses no memory."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ampft.estimate import memory
from ampft.estimate.run import trace_all
from ampft.estimate.trace import fake_mode, trace_step
from tests.helpers import compose_config

B, D, H, C = 8, 16, 32, 4  # batch, input width, hidden width, classes


class TwoLayer(torch.nn.Module):
    """Linear → ReLU → Linear → cross-entropy: small enough to list every tensor its backward keeps."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(D, H), torch.nn.Linear(H, C)

    def forward(self, input_ids, labels):
        logits = self.fc2(torch.relu(self.fc1(input_ids)))
        return SimpleNamespace(loss=torch.nn.functional.cross_entropy(logits, labels))


def _trace(precision: str, fake: bool, target: str = "cpu"):
    mode = fake_mode() if fake else None
    with mode if fake else torch.device("cpu"):
        model = TwoLayer()
        batch = dict(input_ids=torch.randn(B, D), labels=torch.zeros(B, dtype=torch.long))
    return trace_step(model, batch, precision, target, lambda m: torch.optim.AdamW(m.parameters(), foreach=False),
                      0.0, mode)


@pytest.mark.parametrize("fake", [True, False], ids=["fake", "real"])
def test_two_layer_fp32_matches_the_hand_count(fake):
    tr = _trace("fp32", fake)
    params = D * H + H + H * C + C
    assert (tr.params, tr.weights, tr.gradients) == (params, 4 * params, 4 * params)
    assert tr.optimizer_state == 2 * 4 * params + 4 * 4  # exp_avg, exp_avg_sq, and a float32 step per tensor (4)
    # Saved for backward, each storage once: fc1's input, ReLU's output (which fc2 saves too: the same storage),
    # log_softmax's output, the targets (int64) and nll_loss's total weight (one float).
    assert tr.saved_by_dtype == {"float32": 4 * (B * D + B * H + B * C + 1), "int64": 8 * B}
    assert tr.saved_weight_casts == 0
    # FLOPs: three matmuls per linear (forward, input gradient, weight gradient; fc1's input needs no gradient).
    assert tr.forward_backward.flops == 2 * B * (D * H * 2 + H * C * 3)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_two_layer_bf16_keeps_16_bit_activations_and_weight_casts(target):
    tr = _trace("bf16", True, target)
    # The linears run in bf16: their inputs are cast and kept (2 bytes each), and so is the bf16 cast of fc2's weight
    # (for its input's gradient; fc1's input needs none, so its weight cast is dropped after the forward pass). The
    # loss runs in fp32 under both autocasts: the logits are cast up, log_softmax keeps fp32.
    assert tr.saved_weight_casts == 2 * H * C
    assert tr.saved_by_dtype == {"bfloat16": 2 * (B * D + B * H), "float32": 4 * (B * C + 1), "int64": 8 * B}


class WithLayerNorm(TwoLayer):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(H)

    def forward(self, input_ids, labels):
        logits = self.fc2(self.norm(self.fc1(input_ids)))
        return SimpleNamespace(loss=torch.nn.functional.cross_entropy(logits, labels))


def test_cuda_policy_runs_layernorm_in_fp32():
    """CUDA's autocast runs LayerNorm in fp32: it keeps its input cast up to fp32 and fp32 statistics, and fc2 keeps a
    bf16 cast of its fp32 output. CPU's runs it in bf16: it keeps fc1's bf16 output and bf16 statistics, and fc2
    keeps LayerNorm's bf16 output."""
    saved = {}
    for target in ("cpu", "cuda"):
        mode = fake_mode()
        with mode:
            model = WithLayerNorm()
            batch = dict(input_ids=torch.randn(B, D), labels=torch.zeros(B, dtype=torch.long))
        saved[target] = trace_step(model, batch, "bf16", target, mode=mode).saved_by_dtype
    stats = 2 * B  # LayerNorm's mean and rstd: one number each per row
    assert saved["cpu"] == {"bfloat16": 2 * (B * D + 2 * B * H + stats), "float32": 4 * (B * C + 1), "int64": 8 * B}
    assert saved["cuda"] == {"bfloat16": 2 * (B * D + B * H), "float32": 4 * (B * C + 1 + B * H + stats),
                             "int64": 8 * B}


def test_cuda_attention_keeps_no_seq_by_seq_tensors():
    """With dropout, CPU SDPA falls back to the math path and keeps seq x seq probabilities and dropout masks; CUDA's
    fused kernels do not. Doubling the length doubles the GPU trace's activations but for the attention mask (the CPU
    flash kernel keeps two fp32 B x L x L copies per layer: an overcount the docs state), and far more than doubles
    the CPU's."""
    def excess(target):
        a = {}
        for length in (128, 256):
            cfg = compose_config("estimate", ["model=tiny-bert", "trainer.batch_size=4", f"task.max_length={length}"])
            a[length] = trace_all(cfg, ["fp32"], target)[0]["fp32"].saved_activations
        return a[256] - 2 * a[128]

    mask_growth = 2 * 8 * 4 * (256**2 - 2 * 128**2)  # layers x bytes per element x batch x (L'^2 - 2 L^2)
    assert 0 <= excess("cuda") <= mask_growth
    assert excess("cpu") > 5 * mask_growth


def _peak_rss_reset() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, the resident peak


def _hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_bert_large_32x384_traces_without_memory():
    """BERT-large at 32 x 384 needs about 25 GiB in fp32; its fake trace holds none of it."""
    cfg = compose_config("estimate", ["model=bert-large", "trainer.batch_size=32", "task.max_length=384"])
    import ampft.models  # noqa: F401  (imports before the baseline)

    rss = _hwm_bytes()
    _peak_rss_reset()
    tr = trace_all(cfg, ["fp32"], "cuda")[0]["fp32"]
    grew = _hwm_bytes() - min(rss, _hwm_bytes())
    assert tr.params > 330e6 and memory.breakdown(tr, "single", cfg, 1)["peak"] > 20 * 2**30
    assert grew < 0.5 * 2**30, f"the trace grew the resident set by {grew / 2**30:.2f} GiB"

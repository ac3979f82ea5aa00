"""Training batches by length: `LengthGroupedSampler` (off by default: it costs accuracy) and `LengthChunks`
(each random batch run as chunks of similar lengths: the same examples and loss, less padding)."""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch.utils.data import Sampler

from ampft.config import Backend, Padding


class LengthGroupedSampler(Sampler[int]):
    """Random batches of similar lengths (sorted within mega-batches, then shuffled), reproducible per epoch; the
    longest first (an out-of-memory error shows at step 1), the one partial batch last."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int, mega_batches: int = 8):
        self.lengths, self.batch_size, self.seed, self.mega = list(lengths), batch_size, seed, mega_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        perm = torch.randperm(len(self.lengths), generator=g).tolist()
        bs, span = self.batch_size, self.batch_size * self.mega
        batches = []
        for start in range(0, len(perm), span):
            group = sorted(perm[start:start + span], key=self.lengths.__getitem__, reverse=True)
            batches += [group[i:i + bs] for i in range(0, len(group), bs)]
        partial = [batches.pop()] if batches and len(batches[-1]) < bs else []
        if batches:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
            first = max(range(len(batches)), key=lambda i: self.lengths[batches[i][0]])
            batches.insert(0, batches.pop(first))
        for batch in batches + partial:
            yield from batch


MINILM_CHUNK_COST, MINILM_PARAMS = 144, 22.7e6  # chunk_cost's reference: MiniLM-L6, measured


def chunk_cost(model=None) -> int:
    """What one more forward and backward costs beyond its tokens, in tokens (per-call work: gradients written,
    op dispatch). It grows more slowly than the model: 144 for MiniLM-L6 times (parameters / 22.7M)^-0.43, the
    fit to `scripts/microbench.py chunks` (docs/benchmarks/microbench.md). Without a model: MiniLM-L6's."""
    if model is None:
        return MINILM_CHUNK_COST
    params = sum(p.numel() for p in model.parameters())
    return round(MINILM_CHUNK_COST * (params / MINILM_PARAMS) ** -0.43)


def split_by_length(lengths: list[int], max_chunks: int, multiple: int | None = None,
                    overhead: int = 0) -> list[list[int]]:
    """Split one batch (positions into `lengths`), sorted longest first, into at most `max_chunks` chunks at
    the cuts that minimise padded tokens (rounded up to `multiple`) plus `overhead` per chunk. Longest chunk
    first; ties go to fewer chunks."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    m = multiple or 1
    width = [-(-lengths[i] // m) * m for i in order]
    n, inf = len(order), float("inf")
    best = [[0.0] + [inf] * n]  # best[k][j]: the cheapest split of the j longest rows into k chunks
    cut = [[0] * (n + 1)]
    for k in range(1, max_chunks + 1):
        best.append([inf] * (n + 1))
        cut.append([0] * (n + 1))
        for j in range(k, n + 1):
            for i in range(k - 1, j):  # the k-th chunk is rows i..j-1, padded to row i's width
                cost = best[k - 1][i] + (j - i) * width[i] + overhead
                if cost < best[k][j]:
                    best[k][j], cut[k][j] = cost, i
    count = min(range(1, min(max_chunks, n) + 1), key=lambda k: best[k][n]) if n else 0
    chunks, j = [], n
    for k in range(count, 0, -1):  # walk the cuts back from the last row
        chunks.append(order[cut[k][j]:j])
        j = cut[k][j]
    return chunks[::-1]


class LengthChunks:
    """A training collator: each batch as up to `max_chunks` chunks of similar lengths (one where splitting
    would not pay); `ampft.engine.train_step` weighs their losses so the update is the whole batch's."""

    def __init__(self, collate, max_chunks: int, multiple: int | None, cost: int):
        self.collate, self.max_chunks, self.multiple, self.cost = collate, max_chunks, multiple, cost

    def __call__(self, features: list[dict]):
        chunks = split_by_length([len(f["input_ids"]) for f in features], self.max_chunks, self.multiple, self.cost)
        if len(chunks) <= 1:
            return self.collate(features)
        return [self.collate([features[i] for i in chunk]) for chunk in chunks]


def length_chunks(cfg: DictConfig, device: torch.device) -> int:
    """trainer.length_chunks, or (null) 4 on CPU and 1 on CUDA (measured on CPU only). Always 1 under DeepSpeed
    (it counts micro-batches itself), torch.compile (a recompile per chunk size) and padding=max_length."""
    tr = cfg.trainer
    if cfg.distributed.backend == Backend.deepspeed or tr.compile or tr.padding == Padding.max_length:
        return 1
    if tr.length_chunks is not None:
        return tr.length_chunks
    return 4 if device.type == "cpu" else 1

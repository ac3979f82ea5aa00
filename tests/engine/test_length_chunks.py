"""Length chunks (`ampft.data.LengthChunks`, `split_by_length`, the chunk loop of `ampft.engine.train_step`):
a training batch split into chunks of similar lengths holds the batch's examples, costs the fewest padded
tokens plus per-chunk overhead there are, and trains exactly as the whole batch (losses, updates,
evaluation) for sequence labels and for token labels, whose chunks are weighted by labelled tokens."""

from __future__ import annotations

import contextlib
import json
import math
import random

import pytest
import torch

from ampft import tasks
from ampft.config import ConfigError
from ampft.data import build_dataloaders, chunk_cost, length_chunks, prepare_data, split_by_length
from ampft.finetune import run
from ampft.models import load_tokenizer
from ampft.validation import validate
from tests.helpers import shared

NO_DROPOUT = ["+model.arch.hidden_dropout_prob=0.0", "+model.arch.attention_probs_dropout_prob=0.0"]


def _cost(chunks: list[list[int]], lengths: list[int], overhead: int, multiple: int | None) -> int:
    m = multiple or 1
    return sum(len(c) * m * math.ceil(max(lengths[i] for i in c) / m) + overhead for c in chunks)


def _partitions(items: list[int]):
    """Every partition of `items` into non-empty blocks."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for p in _partitions(rest):
        yield [[first], *p]
        for i in range(len(p)):
            yield [*p[:i], [first, *p[i]], *p[i + 1:]]


def test_split_by_length_is_the_cheapest_of_all_partitions():
    rng = random.Random(0)
    for _ in range(150):
        n = rng.randint(1, 7)
        lengths = [rng.randint(3, 60) for _ in range(n)]
        k, multiple, overhead = rng.randint(1, 4), rng.choice([None, 8]), rng.choice([0, 16, 96])
        chunks = split_by_length(lengths, k, multiple, overhead)
        assert sorted(i for c in chunks for i in c) == list(range(n)) and 1 <= len(chunks) <= k
        flat = [lengths[i] for c in chunks for i in c]
        assert flat == sorted(flat, reverse=True)  # runs of the batch sorted longest first
        # The oracle: every way to group the rows (not only runs of the sorted batch) into at most k chunks.
        best = min(_cost(p, lengths, overhead, multiple) for p in _partitions(list(range(n))) if len(p) <= k)
        assert _cost(chunks, lengths, overhead, multiple) == best, (lengths, k, multiple, overhead)


def test_split_by_length_keeps_batches_that_would_not_gain_whole():
    assert split_by_length([20] * 8, 4) == [list(range(8))]  # equal lengths: nothing to save
    assert split_by_length([5, 40, 12, 13], 1) == [[1, 3, 2, 0]]  # at most one chunk: the whole batch
    assert len(split_by_length([120, 8, 8, 8, 8, 8, 8, 8], 4, overhead=124)) == 2  # the long row alone
    assert len(split_by_length([40, 8, 8, 8], 4, overhead=124)) == 1  # saves 96 tokens: not worth a chunk
    assert split_by_length([], 4) == []


def _sst2(compose, tmp_path, *overrides, model=None):
    cfg = compose(["model=tiny-bert", "task=sst2", f"task.train_file={shared('sst2', 'train_first1000.tsv')}",
                   f"task.validation_file={shared('sst2', 'dev.tsv')}", "task.max_train_samples=256",
                   "task.max_length=64", "trainer.batch_size=32", f"cache_dir={tmp_path}", *overrides])
    family = tasks.family_for(cfg.task.family)
    tokenizer = family.adapt_tokenizer(load_tokenizer(cfg.model))
    data = prepare_data(cfg, family, tokenizer, contextlib.nullcontext)
    torch.manual_seed(0)  # the random sampler's order (Accelerate seeds it from the config in a run)
    return list(build_dataloaders(cfg, data, tokenizer, torch.device("cpu"), model=model)[0])


@pytest.mark.data
def test_chunked_batches_hold_the_batch_each_chunk_padded_to_its_own_longest_row(compose, tmp_path):
    whole = _sst2(compose, tmp_path, "trainer.length_chunks=1")
    chunked = _sst2(compose, tmp_path, "trainer.length_chunks=4")
    assert len(whole) == len(chunked) == 8 and not any(isinstance(b, list) for b in whole)
    assert sum(isinstance(b, list) for b in chunked) >= 6  # SST-2's lengths vary: most batches are split
    padded = {"whole": 0, "chunked": 0}
    for w, c in zip(whole, chunked, strict=True):
        parts = c if isinstance(c, list) else [c]
        assert 1 <= len(parts) <= 4
        for part in parts:  # padded to the part's own longest row, no further
            assert part["input_ids"].shape[1] == int(part["attention_mask"].sum(1).max())
            padded["chunked"] += part["input_ids"].numel()
        padded["whole"] += w["input_ids"].numel()
        rows = lambda b: sorted(  # noqa: E731  (a batch's examples: tokens and label, padding stripped)
            (tuple(ids[m.bool()].tolist()), int(y)) for ids, m, y in zip(b["input_ids"], b["attention_mask"], b["labels"],
                                                                          strict=True))
        assert rows(w) == sorted(r for p in parts for r in rows(p))  # the same examples, each once
    assert padded["chunked"] < 0.75 * padded["whole"]


def _bert(hidden: int, layers: int):
    from transformers import BertConfig, BertForSequenceClassification
    return BertForSequenceClassification(BertConfig(hidden_size=hidden, num_hidden_layers=layers,
                                                    num_attention_heads=max(1, hidden // 64),
                                                    intermediate_size=4 * hidden if hidden > 64 else 128))


@pytest.mark.data
def test_a_chunk_costs_fewer_tokens_the_bigger_the_model(compose, tmp_path):
    # What one more chunk cost, measured by `scripts/microbench.py chunks` on the development CPU: MiniLM-L6
    # 144 tokens; in one later run tiny-bert 345, MiniLM-L6 124 and BERT-base 62 (docs/benchmarks/microbench.md).
    tiny, minilm, base = _bert(64, 2), _bert(384, 6), _bert(768, 12)
    assert chunk_cost(minilm) == chunk_cost() == 144  # without a model: MiniLM-L6's
    assert chunk_cost(tiny) / chunk_cost(minilm) == pytest.approx(345 / 124, rel=0.03)
    assert chunk_cost(base) / chunk_cost(minilm) == pytest.approx(62 / 124, rel=0.03)
    # The loader prices a chunk for the model it feeds: tiny-bert's costly chunks split fewer batches, into
    # fewer chunks, than BERT-base's; trainer.length_chunk_cost overrides the estimate.
    count = lambda batches: sum(len(b) if isinstance(b, list) else 1 for b in batches)  # noqa: E731
    for_tiny = count(_sst2(compose, tmp_path, "trainer.length_chunks=4", model=tiny))
    for_base = count(_sst2(compose, tmp_path, "trainer.length_chunks=4", model=base))
    assert 8 < for_tiny < for_base <= 32
    assert count(_sst2(compose, tmp_path, "trainer.length_chunks=4", f"trainer.length_chunk_cost={chunk_cost(base)}",
                       model=tiny)) == for_base


@pytest.mark.data
@pytest.mark.parametrize("family", ["classification", "token_classification"])
def test_a_run_in_chunks_trains_exactly_as_in_whole_batches(tiny, tmp_path, family):
    # Token labels: each chunk's mean is over its labelled tokens, so chunks are weighted by those, not by rows.
    task = {"classification": ["task=sst2", f"task.train_file={shared('sst2', 'train_first1000.tsv')}",
                               f"task.validation_file={shared('sst2', 'dev.tsv')}", "task.max_length=64"],
            "token_classification": ["task=conll2003", f"task.train_file={shared('conll2003', 'valid.txt')}",
                                     f"task.validation_file={shared('conll2003', 'valid.txt')}"]}[family]
    base = [*task, *NO_DROPOUT, "task.max_train_samples=192", "trainer.batch_size=32", "trainer.max_steps=6",
            "trainer.log_every=1", "checkpoint.export=false", f"cache_dir={tmp_path / 'cache'}"]
    summaries, losses = {}, {}
    for chunks in (1, 4):
        out = tmp_path / str(chunks)  # a chunk priced at 0 tokens: as many chunks as cut any padding
        summaries[chunks] = run(tiny(*base, f"trainer.length_chunks={chunks}", "trainer.length_chunk_cost=0"), out)
        events = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        losses[chunks] = [e["loss"] for e in events if e["event"] == "train"]
    assert len(losses[1]) == 6 and losses[1][-1] < losses[1][0]  # it trained
    assert losses[4] == pytest.approx(losses[1], rel=1e-5)  # every step: the same loss, after the same updates
    assert summaries[4]["eval"] == pytest.approx(summaries[1]["eval"], rel=1e-4, abs=1e-6)
    assert summaries[4]["train_tokens"] == summaries[1]["train_tokens"]  # the same real tokens


def test_length_chunks_default_by_device_and_never_under_deepspeed_or_compile(compose):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert length_chunks(compose([]), cpu) == 4 and length_chunks(compose([]), cuda) == 1
    assert length_chunks(compose(["trainer.length_chunks=2"]), cuda) == 2
    assert length_chunks(compose(["trainer.padding=max_length"]), cpu) == 1  # every chunk as wide as the batch
    assert length_chunks(compose(["distributed=deepspeed-z2"]), cpu) == 1
    assert length_chunks(compose(["trainer.compile=true"]), cpu) == 1  # static shapes: one graph per chunk size
    with pytest.raises(ConfigError) as err:
        validate(compose(["trainer.compile=true", "trainer.length_chunks=4"]))
    assert any("trainer.length_chunks=4 with trainer.compile=true" in p for p in err.value.problems)
    with pytest.raises(ConfigError) as err:
        validate(compose(["distributed=deepspeed-z2", "trainer.length_chunks=4"]))
    assert any("trainer.length_chunks=4 with distributed=deepspeed-z2" in p for p in err.value.problems)


def test_a_chunk_without_labelled_tokens_adds_nothing(tmp_path):
    # A chunk whose tokens are all -100 (sentences cut to their special tokens) has a NaN mean loss; it must
    # count 0 in the step, not poison it.
    from accelerate import Accelerator
    from transformers import BertConfig, BertForTokenClassification

    from ampft.engine import train_step
    from ampft.finetune import reset_accelerate

    def step(chunks):
        torch.manual_seed(0)
        config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=32, num_labels=3, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
        acc = Accelerator(cpu=True)
        try:
            model = BertForTokenClassification(config)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
            model, opt, sched = acc.prepare(model, opt, sched)
            result = train_step(acc, model, opt, sched, chunks, max_grad_norm=1.0)
            return result.loss, [p.detach().clone() for p in model.parameters()]
        finally:
            reset_accelerate()

    g = torch.Generator().manual_seed(1)
    labelled = dict(input_ids=torch.randint(5, 100, (3, 7), generator=g), attention_mask=torch.ones(3, 7, dtype=torch.long),
                    labels=torch.randint(0, 3, (3, 7), generator=g))
    empty = dict(input_ids=torch.randint(5, 100, (2, 4), generator=g), attention_mask=torch.ones(2, 4, dtype=torch.long),
                 labels=torch.full((2, 4), -100))
    alone_loss, alone = step(labelled)
    both_loss, both = step([labelled, empty])
    assert torch.isfinite(both_loss) and both_loss == pytest.approx(float(alone_loss), rel=1e-6)
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(alone, both, strict=True))

"""`make benchmark-peer`: the configs are fair by construction (every arm the same model, data and
hyper-parameters), bad configs name every problem, the FLOPs count matches a hand count, the report says
when a target is missed, and a real run of a Trainer arm and an ampft arm writes plausible results."""

from __future__ import annotations

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from ampft.benchmark import BenchmarkConfigError
from ampft.benchmark.peer import check, rerender, run_peer
from ampft.benchmark.peer.report import write_report
from ampft.benchmark.peer.results import summarize
from tests.conftest import CONF, compose_config, shared

PEER_CONFIGS = sorted(p.stem for p in (CONF / "peer").glob("*.yaml"))
# What an arm may change: the fast paths (these, optim.implementation, model.attn_implementation).
# Everything else must be the same for every arm.
FAST_PATH_KEYS = {"padding", "group_by_length", "pad_to_multiple_of", "compile", "compile_buckets", "num_workers"}


def compose_peer(overrides: list[str]):
    return compose_config("peer_recipe", overrides).peer


@pytest.mark.parametrize("name", PEER_CONFIGS)
def test_peer_config_arms_differ_only_by_fast_paths(name):
    shared("sst2")
    # Random weights for every arm: the check must not need the Hub (bert-large's weights are not here).
    p = compose_peer([f"peer={name}", 'peer.extra=["model.pretrained=false"]'])
    cfgs = check(p)
    assert set(cfgs) == {a.name for a in p.arms}
    runners = {a.runner for a in p.arms}
    assert runners == {"trainer", "ampft"}
    first = OmegaConf.to_container(next(iter(cfgs.values())), resolve=True)
    for arm, cfg in cfgs.items():
        c = OmegaConf.to_container(cfg, resolve=True)
        for group in ("task", "scheduler", "precision", "checkpoint", "distributed"):
            assert c[group] == first[group], (arm, group)
        assert {k: v for k, v in c["optim"].items() if k != "implementation"} == \
            {k: v for k, v in first["optim"].items() if k != "implementation"}, arm
        assert {k: v for k, v in c["trainer"].items() if k not in FAST_PATH_KEYS} == \
            {k: v for k, v in first["trainer"].items() if k not in FAST_PATH_KEYS}, arm
        assert {k: v for k, v in c["model"].items() if k != "attn_implementation"} == \
            {k: v for k, v in first["model"].items() if k != "attn_implementation"}, arm
    for t in p.targets:
        assert t.arm in cfgs and t.over in cfgs


def test_bad_peer_config_names_every_problem():
    p = compose_peer(['peer.arms=[{name: a, runner: ampft, overrides: ["trainer.nonsense=1"]},'
                      '{name: a, runner: trainer, overrides: ["task=conll2003", "task.train_file=x.txt",'
                      '"task.validation_file=x.txt"]}, {name: c, runner: ampft, overrides: ["model=bert-large"]}]',
                      "peer.targets=[{arm: a, over: b, min_ratio: 0}]", "peer.seeds=[1,1]"])
    with pytest.raises(BenchmarkConfigError) as err:
        check(p)
    msg = str(err.value)
    for needle in ("duplicate names ['a']", "peer.seeds=[1, 1]", "a over b: both must be arms",
                   "min_ratio=0.0: must be > 0", "trainer.nonsense", "sequence classification only",
                   "peer.arms[2] (c): model bert-large: model.name_or_path=google-bert/bert-large-uncased is a Hub name"):
        assert needle in msg, needle


def _run(arm: str, sps: float, metric: float, load: float = 0.0) -> dict:
    return dict(arm=arm, samples_per_second=sps, tokens_per_second=sps * 10, train_seconds=100 / sps,
                wall_seconds=100 / sps + 5, setup_seconds=2.0, eval={"accuracy": metric}, steps=10, epochs=1.0,
                peak_memory_bytes=2**30, peak_memory_kind="cpu_peak_rss", model_tflops=0.05, precision="fp32",
                attn_implementation="sdpa", train_examples=320, other_load=load)


def test_report_states_missed_targets_and_accuracy_gaps(tmp_path):
    p = compose_peer(['peer.overrides=["model=tiny-bert"]',
                      'peer.arms=[{name: trainer, runner: trainer, overrides: ["trainer.padding=max_length"]},'
                      '{name: ampft, runner: ampft},'
                      '{name: ampft-random, runner: ampft, overrides: ["trainer.group_by_length=false"]}]',
                      "peer.targets=[{arm: ampft, over: trainer, min_ratio: 3}, "
                      "{arm: ampft-random, over: trainer, min_ratio: 3}]",
                      "peer.accuracy_reference=[trainer]"])
    cfgs = check(p)
    runs = [_run("trainer", 10.0, 0.850), _run("ampft", 40.0, 0.853), _run("ampft-random", 20.0, 0.830, load=0.4)]
    env = dict(date="today", device_type="cpu", device_name="a CPU", cpu_count=2, torch_threads=2, torch="t",
               transformers="tf", accelerate="a", python="3")
    results = summarize(p, cfgs, runs, env, "python recipes/peer.py")
    assert results["arms"]["ampft"]["speedup"] == {"trainer": 4.0}
    assert results["arms"]["ampft"]["metric"] == pytest.approx(85.3)  # accuracy in points
    assert [(t["arm"], t["met"]) for t in results["targets"]] == [("ampft", True), ("ampft-random", False)]
    within = {a["arm"]: a["within"] for a in results["accuracy"]}
    assert within == {"ampft": True, "ampft-random": False}
    md = write_report(results, tmp_path).read_text()
    assert "measured 4.00x, **met**" in md and "measured 2.00x, **NOT met**" in md
    assert "ampft-random accuracy within 1 point(s) of trainer: -2.00, **NO**" in md
    assert "**Warning**" in md and "ampft-random 40%" in md
    assert "- trainer.group_by_length=false: 0.50x the samples/s" in md
    assert "| ampft | ampft | (defaults) | 40.0 |" in md


@pytest.mark.slow
def test_trainer_and_ampft_arms_run_for_real(tmp_path):
    train, dev = shared("sst2", "train_first1000.tsv"), shared("sst2", "dev.tsv")
    common = ["model=tiny-bert", "task=sst2", f"task.train_file={train}", f"task.validation_file={dev}",
              "task.max_train_samples=96", "task.max_eval_samples=51", "task.max_length=64", "trainer.batch_size=16",
              "trainer.epochs=1", "optim.lr=1e-3", "trainer.cpu=true", "logging=none", "trainer.progress_bar=false",
              "checkpoint.export=false"]
    p = compose_peer(["peer.overrides=[" + ",".join(f'"{o}"' for o in common) + "]",
                      'peer.arms=[{name: trainer, runner: trainer, overrides: ["trainer.padding=max_length",'
                      '"trainer.group_by_length=false"]}, {name: ampft, runner: ampft}]',
                      "peer.targets=[{arm: ampft, over: trainer, min_ratio: 1}]", "peer.accuracy_reference=[trainer]"])
    path = run_peer(p, tmp_path, command="test")
    results = json.loads((tmp_path / "results.json").read_text())
    assert path == tmp_path / "report.md" and "| trainer | trainer |" in path.read_text()
    for name, a in results["arms"].items():
        assert a["steps"] == 6 and a["train_examples"] == 96, name  # 96 examples / batch 16, both runners
        for key in ("samples_per_second", "tokens_per_second", "train_seconds", "wall_seconds", "model_tflops",
                    "peak_memory_bytes"):
            assert math.isfinite(a[key]) and a[key] > 0, (name, key)
        assert a["train_seconds"] < a["wall_seconds"]
        assert 0 <= a["metric"] <= 100 and a["attn_implementation"] == "sdpa"
    # Both count the same non-padding tokens: tokens/s over samples/s is the mean length for both.
    per_sample = {n: a["tokens_per_second"] / a["samples_per_second"] for n, a in results["arms"].items()}
    assert per_sample["trainer"] == pytest.approx(per_sample["ampft"], rel=0.02)
    assert results["arms"]["trainer"]["padding"] == "max_length"
    assert (tmp_path / "ampft-seed42" / "run" / "summary.json").is_file()
    # The report can be written again from results.json alone (after a change to the report code).
    report = path.read_text()
    path.unlink()
    assert rerender(tmp_path).read_text() == report
    assert torch.tensor([r["eval"]["loss"] for r in results["runs"]]).isfinite().all()


def test_report_over_seeds_gives_means_medians_and_each_seed(tmp_path):
    p = compose_peer(['peer.overrides=["model=tiny-bert"]', "peer.seeds=[1,2]", "peer.targets=[]",
                      "peer.accuracy_reference=[trainer]",
                      'peer.arms=[{name: trainer, runner: trainer}, {name: ampft, runner: ampft}]'])
    cfgs = check(p)
    runs = [dict(_run("trainer", 10.0, 0.80), seed=1), dict(_run("ampft", 30.0, 0.82), seed=1),
            dict(_run("trainer", 12.0, 0.84), seed=2), dict(_run("ampft", 34.0, 0.83), seed=2)]
    env = dict(date="today", device_type="cpu", device_name="a CPU", cpu_count=2, torch_threads=2, torch="t",
               transformers="tf", accelerate="a", python="3")
    results = summarize(p, cfgs, runs, env, None)
    a = results["arms"]["ampft"]
    assert a["samples_per_second"] == 32.0 and a["metric"] == pytest.approx(82.5)
    assert a["metric_std"] == pytest.approx(0.7071, abs=1e-3) and a["metric_per_seed"] == pytest.approx([82, 83])
    assert results["accuracy"] == [dict(arm="ampft", reference="trainer", difference=pytest.approx(0.5), within=True)]
    md = write_report(results, tmp_path).read_text()
    assert "| ampft | ampft | (defaults) | 32.0 |" in md and "82.50 ± 0.71" in md
    assert "| ampft | 30.0 | 82.00 | 34.0 | 83.00 |" in md

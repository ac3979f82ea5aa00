"""`make benchmark-peer`: the configs are fair by construction (every arm the same model, data and
hyper-parameters), bad configs name every problem, the FLOPs count matches a hand count, the report says
when a target is missed, and a real run of a Trainer arm and an ampft arm writes plausible results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from ampft.benchmark import BenchmarkConfigError, rerender, write_outputs
from ampft.benchmark.config import check_peer as check
from ampft.benchmark.peer import run_peer
from ampft.benchmark.results import paired_accuracy, precision_pairs
from ampft.benchmark.results import summarize_peer as summarize
from tests.helpers import CONF, compose_config, shared

PEER_CONFIGS = sorted(p.stem for p in (CONF / "peer").glob("*.yaml"))
# What an arm may change: the fast paths (these, optim.implementation, model.attn_implementation) and the
# precision (an fp32 arm's twin). Everything else must be the same for every arm.
FAST_PATH_KEYS = {"padding", "group_by_length", "length_chunks", "length_chunk_cost", "pad_to_multiple_of", "compile",
                  "compile_buckets", "num_workers"}


def compose_peer(overrides: list[str]):
    return compose_config("peer_recipe", overrides).peer


@pytest.mark.parametrize("name", PEER_CONFIGS)
def test_peer_config_arms_differ_only_by_fast_paths_and_precision(name):
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
        assert c["precision"]["name"] in ("fp32", "bf16"), arm
        for group in ("task", "scheduler", "checkpoint", "distributed"):
            assert c[group] == first[group], (arm, group)
        assert {k: v for k, v in c["optim"].items() if k != "implementation"} == \
            {k: v for k, v in first["optim"].items() if k != "implementation"}, arm
        assert {k: v for k, v in c["trainer"].items() if k not in FAST_PATH_KEYS} == \
            {k: v for k, v in first["trainer"].items() if k not in FAST_PATH_KEYS}, arm
        assert {k: v for k, v in c["model"].items() if k != "attn_implementation"} == \
            {k: v for k, v in first["model"].items() if k != "attn_implementation"}, arm
    for t in p.targets:
        assert t.arm in cfgs and t.over in cfgs
    # Both sides run in fp32 and bf16, each bf16 arm the twin of an fp32 arm of its runner.
    pairs = precision_pairs(p, cfgs)
    assert {(next(a.runner for a in p.arms if a.name == f), cfgs[f].precision.name.value, cfgs[b].precision.name.value)
            for f, b in pairs} == {("trainer", "fp32", "bf16"), ("ampft", "fp32", "bf16")}


def test_bad_peer_config_names_every_problem(tmp_path):
    tsv = tmp_path / "sst2.tsv"  # arm c's own files, so that its model is checked wherever the real data is missing
    tsv.write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
    files = f'"task.train_file={tsv}", "task.validation_file={tsv}"'
    p = compose_peer(['peer.arms=[{name: a, runner: ampft, overrides: ["trainer.nonsense=1"]},'
                      '{name: a, runner: trainer, overrides: ["task=conll2003", "task.train_file=x.txt",'
                      '"task.validation_file=x.txt"]}, {name: c, runner: ampft, overrides: ["model=bert-large", '
                      + files + ']},'
                      '{name: d, runner: ampft, modes: [speed]}]',
                      "peer.targets=[{arm: a, over: b, min_ratio: 0}]", "peer.seeds=[1,1]"])
    with pytest.raises(BenchmarkConfigError) as err:
        check(p)
    msg = str(err.value)
    for needle in ("duplicate names ['a']", "peer.seeds=[1, 1]", "a over b: both must be arms",
                   "min_ratio=0.0: must be > 0", "trainer.nonsense", "sequence classification only",
                   "peer.arms[2] (c): model bert-large: model.name_or_path=google-bert/bert-large-uncased is a Hub name",
                   "peer.arms[3] (d): modes=['speed']; a comparison has no modes"):
        assert needle in msg, needle


def _run(arm: str, sps: float, metric: float, load: float = 0.0, precision: str = "fp32") -> dict:
    return dict(arm=arm, train_samples_per_second=sps, train_tokens_per_second=sps * 10, train_seconds=100 / sps,
                wall_seconds=100 / sps + 5, setup_seconds=2.0, eval={"accuracy": metric}, steps=10, epochs=1.0,
                peak_memory_bytes=2**30, peak_memory_kind="cpu_peak_rss", model_tflops=0.05, precision=precision,
                attn_implementation="sdpa", train_examples=320, other_load=load)


def _env(**changes) -> dict:
    return dict(date="today", device_type="cpu", device_name="AMD EPYC 9B14", device_memory_bytes=None,
                compute_capability=None, driver=None, cuda=None, cudnn=None, cpu="AMD EPYC 9B14", cpu_count=2,
                cpu_features=["avx2", "avx512f"], torch_threads=2, load_average=0.5, python="3", os="Linux",
                torch="t", transformers="tf", accelerate="a") | changes


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
    env = _env()
    results = summarize(p, cfgs, runs, env, "python recipes/peer.py")
    assert results["arms"]["ampft"]["speedup"] == {"trainer": 4.0}
    assert results["arms"]["ampft"]["metric"] == pytest.approx(85.3)  # accuracy in points
    assert [(t["arm"], t["met"]) for t in results["targets"]] == [("ampft", True), ("ampft-random", False)]
    within = {a["arm"]: a["within"] for a in results["accuracy"]}
    assert within == {"ampft": True, "ampft-random": False}
    md = write_outputs(results, tmp_path).read_text()
    assert "measured 4.00x, **met**" in md and "measured 2.00x, **NOT met**" in md
    assert "ampft-random accuracy within 1 point(s) of trainer: -2.00, **NO**" in md
    assert "**Warning**" in md and "ampft-random 40%" in md
    assert "- trainer.group_by_length=false: 0.50x the samples/s" in md
    assert "| ampft | ampft | (defaults) | 40.0 |" in md


@pytest.mark.slow
def test_trainer_and_ampft_arms_run_for_real_in_fp32_and_bf16(tmp_path):
    train, dev = shared("sst2", "train_first1000.tsv"), shared("sst2", "dev.tsv")
    # logging=none and no progress bar, as conf/peer/*.yaml ship them: the Trainer arm logs nowhere either.
    common = ["model=tiny-bert", "task=sst2", f"task.train_file={train}", f"task.validation_file={dev}",
              "task.max_train_samples=96", "task.max_eval_samples=51", "task.max_length=64", "trainer.batch_size=16",
              "trainer.epochs=1", "optim.lr=1e-3", "trainer.cpu=true", "logging=none", "trainer.progress_bar=false",
              "checkpoint.export=false"]
    p = compose_peer(["peer.overrides=[" + ",".join(f'"{o}"' for o in common) + "]",
                      'peer.arms=[{name: trainer, runner: trainer, overrides: ["trainer.padding=max_length",'
                      '"trainer.group_by_length=false"]}, {name: ampft, runner: ampft},'
                      '{name: trainer-bf16, runner: trainer, overrides: ["trainer.padding=max_length",'
                      '"trainer.group_by_length=false", "precision=bf16"]},'
                      '{name: ampft-bf16, runner: ampft, overrides: ["precision=bf16"]}]',
                      "peer.targets=[{arm: ampft, over: trainer, min_ratio: 1}]", "peer.accuracy_reference=[trainer]"])
    path = run_peer(p, tmp_path, command="test")
    results = json.loads((tmp_path / "results.json").read_text())
    md = path.read_text()
    assert path == tmp_path / "report.md" and "| trainer | trainer |" in md
    arms = results["arms"]
    # Both sides really ran in both precisions (the Trainer's own autocast setting is checked in its process).
    assert {n: a["precision"] for n, a in arms.items()} == {"trainer": "fp32", "ampft": "fp32", "trainer-bf16": "bf16",
                                                          "ampft-bf16": "bf16"}
    sps = {n: a["samples_per_second"] for n, a in arms.items()}
    metric = {n: a["metric"] for n, a in arms.items()}
    gains = {(g["fp32"], g["arm"]): g for g in results["precision_gains"]}
    assert set(gains) == {("trainer", "trainer-bf16"), ("ampft", "ampft-bf16")}
    for (fp32, bf16), g in gains.items():
        assert g["ratio"] == sps[bf16] / sps[fp32] and g["metric_difference"] == pytest.approx(metric[bf16] - metric[fp32])
        assert (f"| {g['runner']} | {fp32} | {bf16} | {sps[fp32]:.1f} | {sps[bf16]:.1f} | {sps[bf16] / sps[fp32]:.2f}x |"
                in md)
    [v] = results["by_precision"]
    for r, (t, a) in zip(v["rows"], [("trainer", "ampft"), ("trainer-bf16", "ampft-bf16")], strict=True):
        assert (r["trainer"], r["ampft"], r["ratio"]) == (t, a, sps[a] / sps[t])
        assert (f"| {arms[a]['precision']} | {t} | {a} | {sps[t]:.1f} | {sps[a]:.1f} | {sps[a] / sps[t]:.2f}x | "
                f"{metric[t]:.2f} | {metric[a]:.2f} | {metric[a] - metric[t]:+.2f} |") in md
    assert v["gain_ratio"] == pytest.approx((sps["ampft-bf16"] / sps["ampft"]) / (sps["trainer-bf16"] / sps["trainer"]))
    assert arms["ampft-bf16"]["speedup"] == {"trainer-bf16": sps["ampft-bf16"] / sps["trainer-bf16"]}
    # The machine it ran on: this CPU's model and flags.
    env = results["environment"]
    assert f"| CPU features | {', '.join(env['cpu_features']) or '—'} |" in md and env["cpu"] in md
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
    assert per_sample["trainer-bf16"] == pytest.approx(per_sample["ampft-bf16"], rel=0.02)
    assert results["arms"]["trainer"]["padding"] == "max_length"
    assert (tmp_path / "ampft-seed42" / "run" / "summary.json").is_file()
    assert (tmp_path / "ampft-bf16-seed42" / "run" / "summary.json").is_file()
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
    env = _env()
    results = summarize(p, cfgs, runs, env, None)
    a = results["arms"]["ampft"]
    assert a["samples_per_second"] == 32.0 and a["metric"] == pytest.approx(82.5)
    assert a["metric_std"] == pytest.approx(0.7071, abs=1e-3) and a["metric_per_seed"] == pytest.approx([82, 83])
    # Paired by seed: +2 and -1 points; the trainer's own seeds are 4 points apart (sd 2.83).
    [acc] = results["accuracy"]
    assert (acc["arm"], acc["reference"], acc["within"], acc["within_reference_std"]) == ("ampft", "trainer", True, True)
    assert acc["per_seed"] == pytest.approx([2.0, -1.0]) and acc["difference"] == pytest.approx(0.5)
    assert acc["standard_error"] == pytest.approx(1.5) and acc["reference_std"] == pytest.approx(2.8284, abs=1e-4)
    md = write_outputs(results, tmp_path).read_text()
    assert ("ampft accuracy within 1 point(s) of trainer: +0.50, **yes**. Paired over 2 seeds: +2.00, -1.00, standard "
            "error 1.50; within one seed standard deviation of trainer (2.83): **yes**.") in md
    assert "| ampft | ampft | (defaults) | 32.0 |" in md and "82.50 ± 0.71" in md
    assert "| ampft | 30.0 | 82.00 | 34.0 | 83.00 |" in md


def test_accuracy_is_judged_paired_by_seed_against_the_references_own_spread():
    """The five paired SST-2 seeds of docs/benchmarks/README.md: ampft's length groups 1.03 points below the
    Trainer, whose own seeds spread by 0.32: outside one standard deviation, and outside a 1-point tolerance."""
    trainer = [85.89, 85.55, 86.12, 85.89, 85.32]
    acc = paired_accuracy([84.40, 84.75, 86.12, 82.91, 85.44], trainer, tolerance=1.0)
    assert acc["per_seed"] == pytest.approx([-1.49, -0.80, 0.0, -2.98, 0.12])
    assert acc["difference"] == pytest.approx(-1.03, abs=0.005) and acc["reference_std"] == pytest.approx(0.32, abs=0.005)
    assert acc["standard_error"] == pytest.approx(0.57, abs=0.005)
    assert not acc["within"] and not acc["within_reference_std"]
    # The same differences shifted up by a point: within both.
    acc = paired_accuracy([a + 1 for a in [84.40, 84.75, 86.12, 82.91, 85.44]], trainer, tolerance=1.0)
    assert acc["within"] and acc["within_reference_std"]
    assert paired_accuracy([85.0], [85.5], 1.0)["within_reference_std"] is None  # one seed: no spread to judge by


def test_bf16_arms_give_each_sides_gain_and_ampft_over_trainer_per_precision(tmp_path):
    """Precision twins are found from the composed configs; every ratio in results.json and report.md is the
    arms' measured samples/s divided, the accuracy differences are paired by seed, and the report names the
    CPU and its flags (here without AVX512-BF16: bf16 is emulated)."""
    p = compose_peer(['peer.overrides=["model=tiny-bert"]', "peer.seeds=[1,2]", "peer.targets=[]",
                      "peer.accuracy_reference=[trainer, trainer-bf16]",
                      'peer.arms=[{name: trainer, runner: trainer}, {name: ampft, runner: ampft},'
                      '{name: trainer-bf16, runner: trainer, overrides: ["precision=bf16"]},'
                      '{name: ampft-bf16, runner: ampft, overrides: ["precision=bf16"]},'
                      '{name: ampft-eager, runner: ampft, overrides: ["model.attn_implementation=eager"]},'
                      '{name: ampft-eager-bf16, runner: ampft, overrides: ["precision=bf16", "trainer.padding=max_length"]}]'])
    cfgs = check(p)
    # ampft-eager-bf16 differs from every fp32 arm by more than the precision: no twin.
    assert precision_pairs(p, cfgs) == [("trainer", "trainer-bf16"), ("ampft", "ampft-bf16")]
    speed = {"trainer": (40.0, 36.0), "ampft": (96.0, 104.0), "trainer-bf16": (60.0, 66.0),
             "ampft-bf16": (120.0, 130.0), "ampft-eager": (90.0, 90.0), "ampft-eager-bf16": (50.0, 50.0)}
    acc = {"trainer": (0.77, 0.76), "ampft": (0.75, 0.76), "trainer-bf16": (0.76, 0.76), "ampft-bf16": (0.75, 0.74),
           "ampft-eager": (0.75, 0.76), "ampft-eager-bf16": (0.70, 0.71)}
    runs = [dict(_run(arm, speed[arm][i], acc[arm][i], precision="bf16" if "bf16" in arm else "fp32"), seed=seed)
            for i, seed in enumerate((1, 2)) for arm in speed]
    results = summarize(p, cfgs, runs, _env(), "python recipes/peer.py")
    arms = results["arms"]
    sps = {n: a["samples_per_second"] for n, a in arms.items()}
    assert sps == {n: (v[0] + v[1]) / 2 for n, v in speed.items()}  # medians of two seeds
    # ampft / Trainer only within a precision
    assert arms["ampft"]["speedup"] == {"trainer": sps["ampft"] / sps["trainer"]}
    assert arms["ampft-bf16"]["speedup"] == {"trainer-bf16": sps["ampft-bf16"] / sps["trainer-bf16"]}
    gains = {g["arm"]: g for g in results["precision_gains"]}
    assert gains["trainer-bf16"]["ratio"] == pytest.approx(63 / 38) and gains["ampft-bf16"]["ratio"] == pytest.approx(1.25)
    assert gains["ampft-bf16"]["metric_difference_per_seed"] == pytest.approx([0.0, -2.0])  # paired by seed
    assert gains["ampft-bf16"]["metric_difference"] == pytest.approx(-1.0)
    [v] = results["by_precision"]
    assert [(r["precision"], r["trainer"], r["ampft"]) for r in v["rows"]] == [
        ("fp32", "trainer", "ampft"), ("bf16", "trainer-bf16", "ampft-bf16")]
    assert v["rows"][0]["ratio"] == pytest.approx(100 / 38) and v["rows"][1]["ratio"] == pytest.approx(125 / 63)
    assert v["rows"][1]["metric_difference"] == pytest.approx(-1.5)  # (75-76 + 74-76) / 2
    assert v["gain_ratio"] == pytest.approx(1.25 / (63 / 38)) and v["gain_at_least_trainer"] is False
    md = write_outputs(results, tmp_path).read_text()
    assert "## bf16 against fp32" in md
    assert "| ampft | ampft | ampft-bf16 | 100.0 | 125.0 | 1.25x | +0.00, -2.00 | -1.00 |" in md
    assert "| trainer | trainer | trainer-bf16 | 38.0 | 63.0 | 1.66x | -1.00, +0.00 | -0.50 |" in md
    assert "| bf16 | trainer-bf16 | ampft-bf16 | 63.0 | 125.0 | 1.98x | 76.00 | 74.50 | -1.50 |" in md
    assert "| fp32 | trainer | ampft | 38.0 | 100.0 | 2.63x | 76.50 | 75.50 | -1.00 |" in md
    assert "ampft's bf16/fp32 gain 1.25x against the Trainer's 1.66x" in md and "**less than the Trainer's**" in md
    assert "This CPU has no native bf16 arithmetic (no AVX512-BF16 or AMX-BF16)" in md
    # the main table: x trainer only for fp32 arms, x trainer-bf16 only for bf16 arms
    assert "| ampft-bf16 | ampft | precision=bf16 | 125.0 | 1250 | 0.8 | 5.8 | 74.50 ± 0.71 | 1024 | — | 1.98 |" in md
    assert "fp32 or bf16 (per arm: see differs by)" in md
    # fast-path ablations stay within the base arm's precision
    assert "- model.attn_implementation=eager: 0.90x" in md and "- precision=bf16" not in md
    assert "| device | AMD EPYC 9B14, 2 cores, CPU only (no GPU) |" in md and "| CPU features | avx2, avx512f |" in md
    # A CPU with AVX512-BF16, and a GPU: the report says which.
    md = write_outputs(summarize(p, cfgs, runs, _env(cpu_features=["avx512_bf16", "amx_bf16"]), None), tmp_path).read_text()
    assert "This CPU has avx512_bf16 and amx_bf16, native bf16 arithmetic." in md
    gpu = _env(device_type="cuda", device_name="NVIDIA H200", device_memory_bytes=141 * 2**30, compute_capability="9.0",
               driver="570", cuda="12.8", cudnn=91000)
    md = write_outputs(summarize(p, cfgs, runs, gpu, None), tmp_path).read_text()
    assert "| device | NVIDIA H200 (141 GiB, compute capability 9.0) |" in md
    assert "| host CPU | AMD EPYC 9B14 (2 cores) |" in md and "| CPU features | avx2, avx512f |" in md
    assert "native bf16 arithmetic" not in md


@pytest.mark.slow
def test_with_random_batches_and_no_dropout_ampft_trains_exactly_as_the_trainer(tmp_path):
    """The Trainer as the oracle for ampft's training maths: with the batches the Trainer would draw (random,
    padded to the longest row) and no dropout (whose random stream differs), every logged loss and the
    evaluation are the Trainer's, in fp32 and in bf16, so the schedule, weight-decay groups, AdamW, clipping,
    data order and initialisation agree. Both arms are profiled the same way: the profile says where the step
    went and counts the tokens of the recorded steps."""
    train, dev = shared("sst2", "train_first1000.tsv"), shared("sst2", "dev.tsv")
    # logging=none and no progress bar, as conf/peer/*.yaml ship them: the Trainer arm logs nowhere either.
    common = ["model=tiny-bert", "+model.arch.hidden_dropout_prob=0.0", "+model.arch.attention_probs_dropout_prob=0.0",
              "task=sst2", f"task.train_file={train}", f"task.validation_file={dev}", "task.max_train_samples=160",
              "task.max_eval_samples=64", "task.max_length=64", "trainer.batch_size=16", "trainer.epochs=1",
              "trainer.log_every=1", "optim.lr=1e-3", "scheduler.warmup_ratio=0.2", "trainer.cpu=true",
              "trainer.length_chunks=1", "logging=none", "trainer.progress_bar=false", "checkpoint.export=false"]
    p = compose_peer(["peer.overrides=[" + ",".join(f'"{o}"' for o in common) + "]", "peer.profile_steps=3",
                      "peer.targets=[]", "peer.accuracy_reference=[]",
                      'peer.arms=[{name: trainer, runner: trainer}, {name: ampft, runner: ampft},'
                      '{name: trainer-bf16, runner: trainer, overrides: ["precision=bf16"]},'
                      '{name: ampft-bf16, runner: ampft, overrides: ["precision=bf16"]}]'])
    path = run_peer(p, tmp_path, command="test")
    runs = {r["arm"]: r for r in json.loads((tmp_path / "results.json").read_text())["runs"]}
    for trainer, ampft in (("trainer", "ampft"), ("trainer-bf16", "ampft-bf16")):
        t, a = runs[trainer], runs[ampft]
        assert [s for s, _, _ in a["loss_curve"]] == list(range(1, 11)) == [s for s, _, _ in t["loss_curve"]]
        assert [x for _, x, _ in a["loss_curve"]] == pytest.approx([x for _, x, _ in t["loss_curve"]], rel=1e-6,
                                                                  abs=1e-7), ampft
        assert [lr for _, _, lr in a["loss_curve"]] == pytest.approx([lr for _, _, lr in t["loss_curve"]], rel=1e-9)
        assert a["eval"]["loss"] == pytest.approx(t["eval"]["loss"], rel=1e-5), ampft
        assert a["eval"]["accuracy"] == t["eval"]["accuracy"], ampft
    assert runs["ampft-bf16"]["loss_curve"] != runs["ampft"]["loss_curve"]  # bf16 really ran
    lrs = [lr for _, _, lr in runs["ampft"]["loss_curve"]]
    assert lrs[0] == 0.0 and max(lrs) == pytest.approx(1e-3) and lrs[-1] > 0  # warm-up from 0; the last step's lr
    md = path.read_text()
    assert "## Where a step's time goes (torch.profiler)" in md
    for name, r in runs.items():
        prof = r["profile"]
        assert prof["steps"] == 3 and (tmp_path / f"{name}-seed42" / "profile.txt").is_file(), name
        assert prof["real_tokens_per_step"] <= prof["padded_tokens_per_step"] <= 16 * 64, name
        assert prof["categories"]["matmul"] > 0 and prof["categories"]["optimizer"] > 0, name
        assert prof["ms_per_step"] == pytest.approx(sum(prof["categories"].values()))
    # The same batches on both sides: the same tokens in the recorded steps (fp32 and bf16: no rounding on a CPU).
    assert len({(r["profile"]["padded_tokens_per_step"], r["profile"]["real_tokens_per_step"])
                for r in runs.values()}) == 1
    assert "dtype casts" in runs["ampft-bf16"]["profile"]["categories"]


def test_a_stopped_benchmark_keeps_a_report_of_the_seeds_it_finished(tmp_path, monkeypatch):
    """results.json and report.md are rewritten after every seed: a benchmark killed during seed 2 (here: an
    arm that raises) leaves the report over seed 1, marked partial, and rerender reproduces it."""
    from ampft.benchmark import peer as runner

    p = compose_peer(['peer.overrides=["model=tiny-bert"]', "peer.seeds=[1,2,3]", "peer.targets=[]",
                      "peer.accuracy_reference=[trainer]",
                      'peer.arms=[{name: trainer, runner: trainer}, {name: ampft, runner: ampft}]'])

    def fake_arm(arm, cfg, arm_dir, profile_steps=0):
        if cfg.trainer.seed == 2 and arm.name == "ampft":
            raise KeyboardInterrupt
        run = _run(arm.name, 10.0 if arm.name == "trainer" else 30.0, 0.8)
        return {k: v for k, v in run.items() if k not in ("arm", "train_examples", "model_tflops")}

    monkeypatch.setattr(runner, "_run_arm", fake_arm)
    monkeypatch.setattr(runner, "epoch_flops", lambda cfg: (320, 1e12))
    with pytest.raises(KeyboardInterrupt):
        run_peer(p, tmp_path, command="test")
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["setup"]["seeds"] == [1] and results["seeds_requested"] == [1, 2, 3]
    assert [(r["arm"], r["seed"]) for r in results["runs"]] == [("trainer", 1), ("ampft", 1)]
    assert results["arms"]["ampft"]["speedup"] == {"trainer": 3.0}
    md = (tmp_path / "report.md").read_text()
    assert "**Partial**: seeds [1] of the [1, 2, 3] asked for" in md
    (tmp_path / "report.md").unlink()
    assert rerender(tmp_path).read_text() == md


def _fake_peer(monkeypatch, seeds: list[int], arms: str, out_dir, metric=lambda arm, seed: 0.80 + 0.01 * seed):
    """run_peer over `seeds` with arms that return made-up but seed-dependent speeds and metrics at once (what
    combine works on is results.json, the same whatever produced the runs)."""
    from ampft.benchmark import peer as runner

    def fake_arm(arm, cfg, arm_dir, profile_steps=0):
        seed = cfg.trainer.seed
        run = _run(arm.name, (10.0 if arm.runner == "trainer" else 30.0) + seed, metric(arm.name, seed),
                   precision=cfg.precision.name.value)
        return {k: v for k, v in run.items() if k not in ("arm", "train_examples", "model_tflops")}

    monkeypatch.setattr(runner, "_run_arm", fake_arm)
    monkeypatch.setattr(runner, "epoch_flops", lambda cfg: (320, 1e12))
    p = compose_peer(['peer.overrides=["model=tiny-bert"]', f"peer.seeds={seeds}", "peer.targets=[]",
                      "peer.accuracy_reference=[trainer]", f"peer.arms={arms}"])
    run_peer(p, out_dir, command=f"peer seeds {seeds}")
    return json.loads((out_dir / "results.json").read_text())


ARMS = '[{name: trainer, runner: trainer}, {name: ampft, runner: ampft}, {name: ampft-bf16, runner: ampft, overrides: ["precision=bf16"]}]'


def test_combine_summarizes_seeds_from_separate_runs_as_one_run_over_all_of_them(tmp_path, monkeypatch):
    """Seed 1 in one run, seeds 2-3 in another, and seed 1 of the Trainer measured again in a third: the combined
    report is the report of one run over seeds 1-3 (the same medians, means, paired differences and bf16
    gains), names its sources and is not partial."""
    from ampft.benchmark.combine import combine

    def metric(arm, seed):
        return 0.80 + 0.01 * seed + {"trainer": 0.0, "ampft": -0.004 * seed, "ampft-bf16": 0.003}[arm]

    one = _fake_peer(monkeypatch, [1, 2, 3], ARMS, tmp_path / "one", metric)
    _fake_peer(monkeypatch, [1], ARMS, tmp_path / "s1", metric)
    _fake_peer(monkeypatch, [2, 3], ARMS, tmp_path / "s23", metric)
    _fake_peer(monkeypatch, [1], "[{name: trainer, runner: trainer}, {name: ampft, runner: ampft}]",
               tmp_path / "again", metric)
    md = combine([tmp_path / "s1", tmp_path / "s23", tmp_path / "again"], tmp_path / "all", command="combine").read_text()
    combined = json.loads((tmp_path / "all" / "results.json").read_text())
    for key in ("arms", "accuracy", "precision_gains", "by_precision", "setup", "targets"):
        assert combined[key] == one[key], key
    assert combined["arms"]["ampft"]["metric_per_seed"] == pytest.approx([80.6, 81.2, 81.8])
    assert [(r["arm"], r["seed"], r["source"]) for r in combined["runs"]][:3] == [
        ("trainer", 1, str(tmp_path / "s1")), ("ampft", 1, str(tmp_path / "s1")), ("ampft-bf16", 1, str(tmp_path / "s1"))]
    assert len(combined["runs"]) == 9  # the Trainer's seed 1 once, from the first directory
    assert "Combined from 3 runs" in md and f"- `{tmp_path / 's23'}`: seeds [2, 3], arms trainer, ampft, ampft-bf16" in md
    assert "**Partial**" not in md and "Paired over 3 seeds" in md and "both ran in each of these runs" in md
    # The same report as one run's but for when, how and where from (the machine section is the same machine's).
    def body(text):
        return [line for line in text.replace("each of these runs", "this run").split("## Hardware")[0].splitlines()
                if line and not line.startswith(("Measured", "Command", "Combined", "- `"))]

    assert body(md) == body((tmp_path / "one" / "report.md").read_text())


def test_combine_refuses_runs_that_are_not_one_comparison_and_names_every_reason(tmp_path, monkeypatch, capsys):
    from ampft.benchmark.combine import combine, main

    _fake_peer(monkeypatch, [1], ARMS, tmp_path / "a")
    _fake_peer(monkeypatch, [2], ARMS, tmp_path / "b", metric=lambda arm, seed: 0.9)
    _fake_peer(monkeypatch, [1, 2], '[{name: trainer, runner: trainer}, {name: ampft, runner: ampft, '
               'overrides: ["trainer.length_chunks=1"]}]', tmp_path / "c", metric=lambda arm, seed: 0.7)
    b = json.loads((tmp_path / "b" / "results.json").read_text())
    b["environment"]["cpu_features"] = ["avx2", "avx512_bf16"]
    b["config"]["extra"] = ["task.max_train_samples=2000"]
    (tmp_path / "b" / "results.json").write_text(json.dumps(b))
    with pytest.raises(BenchmarkConfigError) as err:
        combine([tmp_path / "a", tmp_path / "b", tmp_path / "c"], tmp_path / "out")
    msg = str(err.value)
    assert f"{tmp_path / 'b'}: peer.extra=['task.max_train_samples=2000']" in msg and "another setup" in msg
    assert "cpu_features ['avx2', 'avx512_bf16'] vs" in msg and "cannot be one median" in msg
    assert "arm ampft: ampft [] in" in msg and "['trainer.length_chunks=1'] in" in msg
    assert "arm trainer seed 1: {'accuracy': 0.81} in" in msg and "{'accuracy': 0.7} in" in msg
    assert "arm ampft-bf16 has no run for seed(s) [2]" not in msg  # b measured it
    assert not (tmp_path / "out").exists()  # nothing written
    # A missing seed, and the command line: exit 2 with the reason, not a traceback.
    _fake_peer(monkeypatch, [3], "[{name: trainer, runner: trainer}, {name: ampft, runner: ampft}]", tmp_path / "d")
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "out"), str(tmp_path / "a"), str(tmp_path / "d"), str(tmp_path / "nowhere")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "nowhere: no readable results.json" in err
    with pytest.raises(BenchmarkConfigError, match=r"arm ampft-bf16 has no run for seed\(s\) \[3\]"):
        combine([tmp_path / "a", tmp_path / "d"], tmp_path / "out")


def test_a_saved_comparison_from_before_the_shared_record_keys_still_rerenders(tmp_path):
    """docs/benchmarks keeps comparisons whose runs say samples_per_second/tokens_per_second/train_log: rerender
    reads them with today's keys (train_samples_per_second, ..., loss_curve) and gives the same numbers."""
    saved = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "peer-sst2-chunks" / "seeds" / "results.json"
    old = json.loads(saved.read_text())
    assert "samples_per_second" in old["runs"][0] and "train_log" in old["runs"][0]
    (tmp_path / "results.json").write_text(saved.read_text())
    md = rerender(tmp_path).read_text()
    new = json.loads((tmp_path / "results.json").read_text())
    for name, arm in old["arms"].items():
        assert new["arms"][name]["samples_per_second"] == pytest.approx(arm["samples_per_second"]), name
        assert f"| {name} | {arm['runner']} |" in md
    assert "loss_curve" in new["runs"][0] and "train_log" not in new["runs"][0]

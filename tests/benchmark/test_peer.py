"""Comparisons with the Trainer (`make benchmark-peer`): benchmark configs whose accuracy mode has Trainer arms.
The configs are fair by construction (every arm the same model, data and hyper-parameters), bad configs name
every problem, the report says when a target is missed, seeds measured apart combine into one report, and a
real run of Trainer and ampft arms writes plausible results (slow)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from omegaconf import OmegaConf

from ampft.benchmark import BenchmarkConfigError, check, rerender, run_benchmark, write_outputs
from ampft.benchmark import runner as benchmark_runner
from ampft.benchmark.report import render
from ampft.benchmark.results import paired_accuracy, precision_pairs, resummarize, summarize_accuracy
from tests.helpers import CONF, ROOT, compose_config, shared

PEER_CONFIGS = sorted(p.stem for p in (CONF / "benchmark").glob("peer-*.yaml"))
# What an arm may change: the fast paths (these, optim.implementation, model.attn_implementation) and the
# precision (an fp32 arm's twin). Everything else must be the same for every arm.
FAST_PATH_KEYS = {"padding", "group_by_length", "length_chunks", "length_chunk_cost", "pad_to_multiple_of", "compile",
                  "compile_buckets", "num_workers"}
TWO = '[{name: trainer, runner: trainer}, {name: ampft, runner: ampft}]'


def compose(*overrides: str):
    """A comparison: accuracy mode only, isolated runs, tiny-bert on the demo task, baseline `trainer`."""
    return compose_config("benchmark_recipe", ["benchmark.modes=[accuracy]", "benchmark.model=tiny-bert",
                                               "benchmark.budget_minutes=null",
                                               'benchmark.accuracy.overrides=["checkpoint.export=false"]',
                                               "benchmark.baseline=trainer", "benchmark.accuracy.isolate=true",
                                               "benchmark.accuracy.seeds=[42]", *overrides]).benchmark


@pytest.mark.parametrize("name", PEER_CONFIGS)
def test_peer_config_arms_differ_only_by_fast_paths_and_precision(name):
    shared("sst2")
    # Random weights for every arm: the check must not need the Hub (bert-large's weights are not here).
    b = compose_config("benchmark_recipe", [f"benchmark={name}", 'benchmark.extra=["model.pretrained=false"]']).benchmark
    cfgs = check(b)
    assert {arm for _, arm, _ in cfgs} == {a.name for a in b.arms} and {m for m, _, _ in cfgs} == {"accuracy"}
    assert {a.runner for a in b.arms} == {"trainer", "ampft"} and b.accuracy.isolate
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
    # Both sides run in fp32 and bf16, each bf16 arm the twin of an fp32 arm of its runner.
    pairs = precision_pairs(b, cfgs, [a.name for a in b.arms])
    runner = {a.name: a.runner for a in b.arms}
    precision = {arm: cfg.precision.name.value for (_, arm, _), cfg in cfgs.items()}
    assert {(runner[f], precision[f], precision[x]) for f, x in pairs} == {("trainer", "fp32", "bf16"),
                                                                         ("ampft", "fp32", "bf16")}


def test_bad_comparison_config_names_every_problem(tmp_path):
    tsv = tmp_path / "sst2.tsv"  # arm c's own files, so that its model is checked wherever the real data is missing
    tsv.write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
    files = f'"task.train_file={tsv}", "task.validation_file={tsv}"'
    b = compose('benchmark.arms=[{name: a, runner: ampft, overrides: ["trainer.nonsense=1"]},'
                '{name: a, runner: trainer, overrides: ["task=conll2003", "task.train_file=x.txt",'
                '"task.validation_file=x.txt"]}, {name: c, runner: ampft, overrides: ["model=bert-large", ' + files + ']},'
                '{name: d, runner: trainer, modes: [speed, accuracy]}]',
                "benchmark.modes=[speed, accuracy]", "benchmark.baseline=c",
                "benchmark.targets=[{arm: a, over: b, min_ratio: 0}]", "benchmark.accuracy.seeds=[1,1]",
                "benchmark.accuracy.reference=[e]", "benchmark.accuracy.profile_steps=-1")
    with pytest.raises(BenchmarkConfigError) as err:
        check(b)
    msg = str(err.value)
    for needle in ("duplicate names ['a']", "benchmark.accuracy.seeds=[1, 1] repeats a seed",
                   "benchmark.targets[0]: a over b: both must be arms", "min_ratio=0.0: must be > 0",
                   "trainer.nonsense", "sequence classification only",
                   "benchmark.arms[2] (c, accuracy mode): model bert-large: model.name_or_path=google-bert/"
                   "bert-large-uncased is a Hub name",
                   "benchmark.arms[3] (d): runner=trainer in speed mode, which times ampft's own step: give the arm "
                   "modes: [accuracy]", "benchmark.accuracy.reference has ['e']: not arms",
                   "benchmark.accuracy.profile_steps=-1: give 0"):
        assert needle in msg, needle


def _run(arm: str, sps: float, metric: float, load: float = 0.0, precision: str = "fp32", seed: int = 42,
         runner: str | None = None) -> dict:
    """A made-up accuracy run record, as accuracy.run_isolated returns it."""
    return dict(arm=arm, seed=seed, runner=runner or ("trainer" if arm.startswith("trainer") else "ampft"),
                run_dir="r", precision=precision, precision_requested=precision, main_metric="accuracy",
                diverged=False, error=None, metric=metric, eval={"accuracy": metric, "loss": 0.3},
                train_samples_per_second=sps, train_tokens_per_second=sps * 10, train_seconds=100 / sps,
                wall_seconds=100 / sps + 5, setup_seconds=2.0, steps=10, epochs=1.0, train_loss=0.5,
                train_loss_last=0.4, skipped_steps=None, loss_scale_final=None, peak_memory_bytes=2**30,
                peak_memory_kind="cpu_peak_rss", model_tflops=0.05, attn_implementation="sdpa",
                train_examples=320, other_cpu_share=load, loss_curve=[[5, 0.6, 1e-4], [10, 0.4, 0.0]],
                loss_scale_trace=[], eval_curve=[])


def _env(**changes) -> dict:
    return dict(date="today", device_type="cpu", device_name="AMD EPYC 9B14", device_memory_bytes=None,
                compute_capability=None, driver=None, cuda=None, cudnn=None, cpu="AMD EPYC 9B14", cpu_count=2,
                cpu_features=["avx2", "avx512f"], torch_threads=2, load_average=0.5, python="3", os="Linux",
                torch="t", transformers="tf", accelerate="a") | changes


def _results(b, runs: list[dict], env: dict | None = None) -> dict:
    env = env or _env()
    res = dict(benchmark=OmegaConf.to_container(b, resolve=True, enum_to_str=True), environment=env,
               command="python recipes/benchmark.py", speed=None, accuracy=summarize_accuracy(b, runs, env, check(b)),
               claims=[])
    return res


def test_report_states_missed_targets_and_accuracy_gaps(tmp_path):
    b = compose('benchmark.arms=[{name: trainer, runner: trainer, overrides: ["trainer.padding=max_length"]},'
                '{name: ampft, runner: ampft}, {name: ampft-random, runner: ampft, overrides: ["trainer.length_chunks=1"]}]',
                "benchmark.targets=[{arm: ampft, over: trainer, min_ratio: 3}, "
                "{arm: ampft-random, over: trainer, min_ratio: 3}]")
    res = _results(b, [_run("trainer", 10.0, 0.850), _run("ampft", 40.0, 0.853),
                       _run("ampft-random", 20.0, 0.830, load=0.4)])
    arms = {a["arm"]: a for a in res["accuracy"]["arms"]}
    assert arms["ampft"]["speedup"] == {"trainer": 4.0} and arms["ampft"]["samples_per_second"] == 40.0
    assert [(t["arm"], t["ratio"], t["met"]) for t in res["accuracy"]["targets"]] == [("ampft", 4.0, True),
                                                                                     ("ampft-random", 2.0, False)]
    # The Trainer arms are the default references: within a point, in points.
    checks = {c["arm"]: c for c in res["accuracy"]["checks"]}
    assert checks["ampft"]["within"] and checks["ampft"]["difference"] == pytest.approx(0.3)
    assert not checks["ampft-random"]["within"] and checks["ampft-random"]["difference"] == pytest.approx(-2.0)
    assert res["claims"] == [] and res["accuracy"]["precision_gains"] == []
    md = write_outputs(res, tmp_path).read_text()
    assert md.startswith("# Benchmark `cpu-smoke`: ampft vs the Hugging Face Trainer")
    assert "measured 4.00x, **met**" in md and "measured 2.00x, **NOT met**" in md
    assert "ampft-random accuracy within 1 point(s) of trainer: -2.00, **NO**" in md
    assert "**Warning:**" in md and "`ampft-random` seed 42 (40% of the machine)" in md
    assert "- trainer.length_chunks=1: 0.50x the samples/s" in md
    assert ("| `ampft` | ampft | fp32 | 1 (0 diverged) | 0.8530 (n=1) | +0.0030 (no CI, n=1) | — | 40.0 | 400 | 2.5 | "
            "25% | 7.5 | 1,024 MiB | 4.00 | 0% |") in md
    assert "## Claims" not in md  # the published claims are about ampft's precisions, not a comparison
    (tmp_path / "report.md").unlink()
    assert rerender(tmp_path).read_text() == md


def test_report_over_seeds_gives_means_medians_and_each_seed(tmp_path):
    b = compose(f"benchmark.arms={TWO}", "benchmark.accuracy.seeds=[1,2]")
    runs = [_run("trainer", 10.0, 0.80, seed=1), _run("trainer", 12.0, 0.84, seed=2),
            _run("ampft", 30.0, 0.82, seed=1), _run("ampft", 34.0, 0.83, seed=2)]
    res = _results(b, runs)
    a = {a["arm"]: a for a in res["accuracy"]["arms"]}["ampft"]
    assert a["samples_per_second"] == 32.0 and a["metric"]["mean"] == pytest.approx(0.825)
    assert a["metric"]["std"] == pytest.approx(0.007071, abs=1e-5) and a["metric_per_seed"] == [0.82, 0.83]
    assert a["diff"]["mean"] == pytest.approx(0.005) and a["diff"]["n"] == 2  # paired with the baseline, trainer
    # Paired by seed: +2 and -1 points; the trainer's own seeds are 4 points apart (sd 2.83).
    [c] = res["accuracy"]["checks"]
    assert (c["arm"], c["reference"], c["within"], c["within_reference_std"]) == ("ampft", "trainer", True, True)
    assert c["per_seed"] == pytest.approx([2.0, -1.0]) and c["difference"] == pytest.approx(0.5)
    assert c["standard_error"] == pytest.approx(1.5) and c["reference_std"] == pytest.approx(2.8284, abs=1e-4)
    md = write_outputs(res, tmp_path).read_text()
    assert ("ampft accuracy within 1 point(s) of trainer: +0.50, **yes**. Paired over 2 seeds: +2.00, -1.00, standard "
            "error 1.50; within one seed standard deviation of trainer (2.83): **yes**.") in md
    assert "| `ampft` | 30.0 | 0.8200 | 34.0 | 0.8300 |" in md and "0.8250 ± 0.0071 (n=2)" in md


def test_accuracy_is_judged_paired_by_seed_against_the_references_own_spread():
    """Five paired SST-2 seeds (docs/benchmarks/README.md): ampft's length groups 1.03 points below the
    Trainer, whose own seeds spread by 0.32: outside one standard deviation, and outside a 1-point tolerance."""
    trainer = [85.89, 85.55, 86.12, 85.89, 85.32]
    groups = [84.40, 84.75, 86.12, 82.91, 85.44]
    acc = paired_accuracy(list(zip(groups, trainer, strict=True)), tolerance=1.0)
    assert acc["per_seed"] == pytest.approx([-1.49, -0.80, 0.0, -2.98, 0.12])
    assert acc["difference"] == pytest.approx(-1.03, abs=0.005) and acc["reference_std"] == pytest.approx(0.32, abs=0.005)
    assert acc["standard_error"] == pytest.approx(0.57, abs=0.005)
    assert not acc["within"] and not acc["within_reference_std"]
    # The same differences shifted up by a point: within both.
    acc = paired_accuracy([(a + 1, t) for a, t in zip(groups, trainer, strict=True)], tolerance=1.0)
    assert acc["within"] and acc["within_reference_std"]
    assert paired_accuracy([(85.0, 85.5)], 1.0)["within_reference_std"] is None  # one seed: no spread to judge by


def test_bf16_arms_give_each_sides_gain_and_ampft_over_trainer_per_precision(tmp_path):
    """Precision twins are found from the composed configs; every ratio in results.json and report.md is the
    arms' measured samples/s divided, the accuracy differences are paired by seed, and the report names the
    CPU and its flags (here without AVX512-BF16: bf16 is emulated)."""
    b = compose("benchmark.accuracy.seeds=[1,2]", "benchmark.accuracy.reference=[trainer, trainer-bf16]",
                'benchmark.arms=[{name: trainer, runner: trainer}, {name: ampft, runner: ampft},'
                '{name: trainer-bf16, runner: trainer, overrides: ["precision=bf16"]},'
                '{name: ampft-bf16, runner: ampft, overrides: ["precision=bf16"]},'
                '{name: ampft-eager, runner: ampft, overrides: ["model.attn_implementation=eager"]},'
                '{name: ampft-eager-bf16, runner: ampft, overrides: ["precision=bf16", "trainer.padding=max_length"]}]')
    # ampft-eager-bf16 differs from every fp32 arm by more than the precision: no twin.
    assert precision_pairs(b, check(b), [a.name for a in b.arms]) == [("trainer", "trainer-bf16"), ("ampft", "ampft-bf16")]
    speed = {"trainer": (40.0, 36.0), "ampft": (96.0, 104.0), "trainer-bf16": (60.0, 66.0),
             "ampft-bf16": (120.0, 130.0), "ampft-eager": (90.0, 90.0), "ampft-eager-bf16": (50.0, 50.0)}
    acc = {"trainer": (0.77, 0.76), "ampft": (0.75, 0.76), "trainer-bf16": (0.76, 0.76), "ampft-bf16": (0.75, 0.74),
           "ampft-eager": (0.75, 0.76), "ampft-eager-bf16": (0.70, 0.71)}
    runs = [_run(arm, speed[arm][i], acc[arm][i], precision="bf16" if "bf16" in arm else "fp32", seed=seed)
            for arm in speed for i, seed in enumerate((1, 2))]
    res = _results(b, runs)
    arms = {a["arm"]: a for a in res["accuracy"]["arms"]}
    sps = {n: a["samples_per_second"] for n, a in arms.items()}
    assert sps == {n: (v[0] + v[1]) / 2 for n, v in speed.items()}  # medians of two seeds
    # ampft / Trainer only within a precision
    assert arms["ampft"]["speedup"] == {"trainer": sps["ampft"] / sps["trainer"]}
    assert arms["ampft-bf16"]["speedup"] == {"trainer-bf16": sps["ampft-bf16"] / sps["trainer-bf16"]}
    gains = {g["arm"]: g for g in res["accuracy"]["precision_gains"]}
    assert gains["trainer-bf16"]["ratio"] == pytest.approx(63 / 38) and gains["ampft-bf16"]["ratio"] == pytest.approx(1.25)
    assert gains["ampft-bf16"]["metric_difference_per_seed"] == pytest.approx([0.0, -2.0])  # paired by seed
    assert gains["ampft-bf16"]["metric_difference"] == pytest.approx(-1.0)
    [v] = res["accuracy"]["by_precision"]
    assert (v["trainer_fp32"], v["trainer"], v["ampft_fp32"], v["ampft"]) == ("trainer", "trainer-bf16", "ampft",
                                                                             "ampft-bf16")
    checks = {(c["arm"], c["reference"]): c for c in res["accuracy"]["checks"]}
    assert checks[("ampft-bf16", "trainer-bf16")]["difference"] == pytest.approx(-1.5)  # (75-76 + 74-76) / 2
    assert v["gain_ratio"] == pytest.approx(1.25 / (63 / 38)) and v["gain_at_least_trainer"] is False
    md = write_outputs(res, tmp_path).read_text()
    assert "### bf16 against fp32" in md
    assert "| ampft | ampft | ampft-bf16 | 100.0 | 125.0 | 1.25x | +0.00, -2.00 | -1.00 |" in md
    assert "| trainer | trainer | trainer-bf16 | 38.0 | 63.0 | 1.66x | -1.00, +0.00 | -0.50 |" in md
    assert "ampft-bf16 accuracy within 1 point(s) of trainer-bf16: -1.50, **NO**." in md
    assert ("ampft's bf16/fp32 gain 1.25x against the Trainer's 1.66x (ampft-bf16 over ampft, trainer-bf16 over "
            "trainer): 0.75x, **less than the Trainer's**.") in md
    assert "This CPU has no native bf16 arithmetic (no AVX512-BF16 or AMX-BF16)" in md
    # the accuracy runs' speeds: x trainer only for fp32 arms, x trainer-bf16 only for bf16 arms
    assert "| `ampft-bf16` | ampft | bf16 | 2 (0 diverged) | 0.7450 ± 0.0071 (n=2) | -0.0200 [-0.0200, -0.0200] | —, — " \
           "| 125.0 | 1,250 | 0.8 | 30% | 5.8 | 1,024 MiB | — | 1.98 | 0% |" in md
    # fast-path ablations stay within the base arm's precision
    assert "- model.attn_implementation=eager: 0.90x" in md and "- precision=bf16" not in md
    assert "| device | AMD EPYC 9B14, 2 cores, CPU only (no GPU) |" in md and "| CPU features | avx2, avx512f |" in md
    # A CPU with AVX512-BF16, and a GPU: the report says which.
    md = write_outputs(_results(b, runs, _env(cpu_features=["avx512_bf16", "amx_bf16"])), tmp_path).read_text()
    assert "This CPU has avx512_bf16 and amx_bf16, native bf16 arithmetic." in md
    gpu = _env(device_type="cuda", device_name="NVIDIA H200", device_memory_bytes=141 * 2**30, compute_capability="9.0",
               driver="570", cuda="12.8", cudnn=91000)
    md = write_outputs(_results(b, runs, gpu), tmp_path).read_text()
    assert "| device | NVIDIA H200 (141 GiB, compute capability 9.0) |" in md
    assert "| host CPU | AMD EPYC 9B14 (2 cores) |" in md and "| CPU features | avx2, avx512f |" in md
    assert "native bf16 arithmetic" not in md


def _sst2(*extra: str) -> list[str]:
    train, dev = shared("sst2", "train_first1000.tsv"), shared("sst2", "dev.tsv")
    shared_ = [f"task.train_file={train}", f"task.validation_file={dev}", "task.max_eval_samples=51",
               "trainer.epochs=1", "optim.lr=1e-3", "trainer.cpu=true", "logging=none", "trainer.progress_bar=false",
               *extra]
    return ["benchmark.task=sst2", "benchmark.seq_len=64", "benchmark.batch_size=16",
            "benchmark.overrides=[" + ",".join(f'"{o}"' for o in shared_) + "]"]


@pytest.mark.slow
def test_trainer_and_ampft_arms_run_for_real_in_fp32_and_bf16(tmp_path):
    # logging=none and no progress bar, as the conf/benchmark/peer-*.yaml ship them: the Trainer logs nowhere either.
    b = compose(*_sst2("task.max_train_samples=96"),
                'benchmark.arms=[{name: trainer, runner: trainer, overrides: ["trainer.padding=max_length",'
                '"trainer.group_by_length=false"]}, {name: ampft, runner: ampft},'
                '{name: trainer-bf16, runner: trainer, overrides: ["trainer.padding=max_length",'
                '"trainer.group_by_length=false", "precision=bf16"]},'
                '{name: ampft-bf16, runner: ampft, overrides: ["precision=bf16"]}]',
                "benchmark.targets=[{arm: ampft, over: trainer, min_ratio: 1}]", "benchmark.accuracy.reference=[trainer]")
    path = run_benchmark(b, tmp_path, command="test")
    res = json.loads((tmp_path / "results.json").read_text())
    md = path.read_text()
    arms = {a["arm"]: a for a in res["accuracy"]["arms"]}
    # Both sides really ran in both precisions (the Trainer's own autocast setting is checked in its process).
    assert {n: a["precision"] for n, a in arms.items()} == {"trainer": "fp32", "ampft": "fp32", "trainer-bf16": "bf16",
                                                          "ampft-bf16": "bf16"}
    sps = {n: a["samples_per_second"] for n, a in arms.items()}
    gains = {(g["fp32"], g["arm"]): g for g in res["accuracy"]["precision_gains"]}
    assert set(gains) == {("trainer", "trainer-bf16"), ("ampft", "ampft-bf16")}
    for (fp32, bf16), g in gains.items():
        assert g["ratio"] == sps[bf16] / sps[fp32]
        assert (f"| {g['runner']} | {fp32} | {bf16} | {sps[fp32]:.1f} | {sps[bf16]:.1f} | {sps[bf16] / sps[fp32]:.2f}x |"
                in md)
    [v] = res["accuracy"]["by_precision"]
    assert v["gain_ratio"] == pytest.approx((sps["ampft-bf16"] / sps["ampft"]) / (sps["trainer-bf16"] / sps["trainer"]))
    env = res["environment"]
    assert f"| CPU features | {', '.join(env['cpu_features']) or '—'} |" in md and env["cpu"] in md
    for name, a in arms.items():
        assert a["steps"] == 6 and a["train_examples"] == 96, name  # 96 examples / batch 16, both runners
        for key in ("samples_per_second", "tokens_per_second", "wall_seconds", "model_tflops", "peak_memory_bytes"):
            assert math.isfinite(a[key]) and a[key] > 0, (name, key)
        assert a["train_seconds"]["median"] < a["wall_seconds"]
        assert 0 <= a["metric"]["mean"] <= 1 and a["attn_implementation"] == "sdpa"
    # Both count the same non-padding tokens: tokens/s over samples/s is the mean length for both.
    per_sample = {n: a["tokens_per_second"] / a["samples_per_second"] for n, a in arms.items()}
    assert per_sample["trainer"] == pytest.approx(per_sample["ampft"], rel=0.02)
    assert per_sample["trainer-bf16"] == pytest.approx(per_sample["ampft-bf16"], rel=0.02)
    for arm in ("ampft", "ampft-bf16"):
        assert (tmp_path / "arms" / "accuracy" / arm / "seed42" / "run" / "summary.json").is_file()
    # The report can be written again from results.json alone (after a change to the report code).
    report = path.read_text()
    path.unlink()
    assert rerender(tmp_path).read_text() == report
    assert torch.tensor([r["eval"]["loss"] for r in res["accuracy"]["runs"]]).isfinite().all()


@pytest.mark.slow
def test_with_random_batches_and_no_dropout_ampft_trains_exactly_as_the_trainer(tmp_path):
    """The Trainer as the oracle for ampft's training maths: with the batches the Trainer would draw (random,
    padded to the longest row) and no dropout (whose random stream differs), every logged loss and the
    evaluation are the Trainer's, in fp32 and in bf16, so the schedule, weight-decay groups, AdamW, clipping,
    data order and initialisation agree. Both arms are profiled the same way: the profile says where the step
    went and counts the tokens of the recorded steps."""
    b = compose(*_sst2("+model.arch.hidden_dropout_prob=0.0", "+model.arch.attention_probs_dropout_prob=0.0",
                       "task.max_train_samples=160", "task.max_eval_samples=64", "trainer.log_every=1",
                       "scheduler.warmup_ratio=0.2", "trainer.length_chunks=1"),
                "benchmark.accuracy.profile_steps=3",
                'benchmark.arms=[{name: trainer, runner: trainer}, {name: ampft, runner: ampft},'
                '{name: trainer-bf16, runner: trainer, overrides: ["precision=bf16"]},'
                '{name: ampft-bf16, runner: ampft, overrides: ["precision=bf16"]}]')
    path = run_benchmark(b, tmp_path, command="test")
    runs = {r["arm"]: r for r in json.loads((tmp_path / "results.json").read_text())["accuracy"]["runs"]}
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
    assert "### Where a step's time goes (torch.profiler)" in md
    for name, r in runs.items():
        prof = r["profile"]
        assert prof["steps"] == 3 and (tmp_path / "arms" / "accuracy" / name / "seed42" / "profile.txt").is_file(), name
        assert prof["real_tokens_per_step"] <= prof["padded_tokens_per_step"] <= 16 * 64, name
        assert prof["categories"]["matmul"] > 0 and prof["categories"]["optimizer"] > 0, name
        assert prof["ms_per_step"] == pytest.approx(sum(prof["categories"].values()))
    # The same batches on both sides: the same tokens in the recorded steps (fp32 and bf16: no rounding on a CPU).
    assert len({(r["profile"]["padded_tokens_per_step"], r["profile"]["real_tokens_per_step"])
                for r in runs.values()}) == 1
    assert "dtype casts" in runs["ampft-bf16"]["profile"]["categories"]


def _fake(monkeypatch, seeds: list[int], arms: str, out_dir, metric=lambda arm, seed: 0.80 + 0.01 * seed,
          stop=None):
    """run_benchmark over `seeds` with isolated runs that return made-up but seed-dependent speeds and metrics
    at once (what the report and combine work on is results.json, the same whatever produced the runs)."""
    def fake_run(arm, cfg, arm_dir, profile_steps=0):
        seed = cfg.trainer.seed
        if stop and stop(arm.name, seed):
            raise KeyboardInterrupt
        return {k: v for k, v in _run(arm.name, (10.0 if arm.runner == "trainer" else 30.0) + seed,
                                      metric(arm.name, seed), precision=cfg.precision.name.value, seed=seed,
                                      runner=arm.runner).items() if k not in ("train_examples", "model_tflops")}

    monkeypatch.setattr(benchmark_runner, "run_isolated", fake_run)
    monkeypatch.setattr(benchmark_runner, "epoch_flops", lambda cfg: (320, 1e12))
    b = compose(f"benchmark.accuracy.seeds={seeds}", f"benchmark.arms={arms}")
    run_benchmark(b, out_dir, command=f"benchmark seeds {seeds}")
    return json.loads((out_dir / "results.json").read_text())


def test_a_stopped_benchmark_keeps_a_report_of_the_seeds_it_finished(tmp_path, monkeypatch):
    """The outputs are rewritten after every seed: a benchmark killed during seed 2 (here: a run that raises)
    leaves the report over seed 1, marked partial, and rerender reproduces it."""
    with pytest.raises(KeyboardInterrupt):
        _fake(monkeypatch, [1, 2, 3], TWO, tmp_path, stop=lambda arm, seed: (arm, seed) == ("ampft", 2))
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["partial_seeds"] == [1] and res["benchmark"]["accuracy"]["seeds"] == [1, 2, 3]
    assert [(r["arm"], r["seed"]) for r in res["accuracy"]["runs"]] == [("trainer", 1), ("ampft", 1)]
    arms = {a["arm"]: a for a in res["accuracy"]["arms"]}
    assert arms["ampft"]["speedup"] == {"trainer": 31 / 11} and arms["ampft"]["model_tflops"] == pytest.approx(
        1e12 * 1.0 / (100 / 31) / 1e12)
    md = (tmp_path / "report.md").read_text()
    assert "**Partial**: seeds [1] of the [1, 2, 3] asked for" in md
    (tmp_path / "report.md").unlink()
    assert rerender(tmp_path).read_text() == md


ARMS = '[{name: trainer, runner: trainer}, {name: ampft, runner: ampft}, {name: ampft-bf16, runner: ampft, overrides: ["precision=bf16"]}]'


def test_combine_summarizes_seeds_from_separate_runs_as_one_run_over_all_of_them(tmp_path, monkeypatch):
    """Seed 1 in one run, seeds 2-3 in another, and seed 1 of the Trainer measured again in a third: the combined
    report is the report of one run over seeds 1-3 (the same medians, means, paired differences and bf16
    gains), names its sources and is not partial."""
    from ampft.benchmark.combine import combine

    def metric(arm, seed):
        return 0.80 + 0.01 * seed + {"trainer": 0.0, "ampft": -0.004 * seed, "ampft-bf16": 0.003}[arm]

    one = _fake(monkeypatch, [1, 2, 3], ARMS, tmp_path / "one", metric)
    _fake(monkeypatch, [1], ARMS, tmp_path / "s1", metric)
    _fake(monkeypatch, [2, 3], ARMS, tmp_path / "s23", metric)
    _fake(monkeypatch, [1], TWO, tmp_path / "again", metric)
    md = combine([tmp_path / "s1", tmp_path / "s23", tmp_path / "again"], tmp_path / "all", command="combine").read_text()
    combined = json.loads((tmp_path / "all" / "results.json").read_text())

    def strip(acc: dict) -> dict:  # where each run came from is the one difference
        return dict(acc, runs=[{k: v for k, v in r.items() if k != "source"} for r in acc["runs"]])

    assert strip(combined["accuracy"]) == one["accuracy"]
    assert combined["benchmark"]["accuracy"] == one["benchmark"]["accuracy"]
    arms = {a["arm"]: a for a in combined["accuracy"]["arms"]}
    assert arms["ampft"]["metric_per_seed"] == pytest.approx([0.806, 0.812, 0.818])
    assert [(r["arm"], r["seed"], r["source"]) for r in combined["accuracy"]["runs"]][:3] == [
        ("trainer", 1, str(tmp_path / "s1")), ("trainer", 2, str(tmp_path / "s23")), ("trainer", 3, str(tmp_path / "s23"))]
    assert len(combined["accuracy"]["runs"]) == 9  # the Trainer's seed 1 once, from the first directory
    assert "Combined from 3 runs" in md and f"- `{tmp_path / 's23'}`: seeds [2, 3], arms trainer, ampft, ampft-bf16" in md
    assert "**Partial**" not in md and "Paired over 3 seeds" in md and "both ran in each of these runs" in md

    # The same report as one run's but for when, how and where from, and the time budget of each run.
    def body(text):
        sections = text.replace("each of these runs", "this run").split("\n## ")
        kept = [s for s in sections if not s.startswith(("Hardware and software", "Time budget"))]
        return [line for line in "\n## ".join(kept).splitlines()
                if line and not line.startswith(("Measured", "Command", "Combined", "- `"))]

    assert body(md) == body((tmp_path / "one" / "report.md").read_text())


def test_combine_refuses_runs_that_are_not_one_comparison_and_names_every_reason(tmp_path, monkeypatch, capsys):
    from ampft.benchmark.combine import combine, main

    _fake(monkeypatch, [1], ARMS, tmp_path / "a")
    _fake(monkeypatch, [2], ARMS, tmp_path / "b", metric=lambda arm, seed: 0.9)
    _fake(monkeypatch, [1, 2], '[{name: trainer, runner: trainer}, {name: ampft, runner: ampft, '
          'overrides: ["trainer.length_chunks=1"]}]', tmp_path / "c", metric=lambda arm, seed: 0.7)
    b = json.loads((tmp_path / "b" / "results.json").read_text())
    b["environment"]["cpu_features"] = ["avx2", "avx512_bf16"]
    b["benchmark"]["extra"] = ["task.max_train_samples=2000"]
    (tmp_path / "b" / "results.json").write_text(json.dumps(b))
    with pytest.raises(BenchmarkConfigError) as err:
        combine([tmp_path / "a", tmp_path / "b", tmp_path / "c"], tmp_path / "out")
    msg = str(err.value)
    assert f"{tmp_path / 'b'}: extra=['task.max_train_samples=2000']" in msg and "another setup" in msg
    assert "cpu_features ['avx2', 'avx512_bf16'] vs" in msg and "cannot be one median" in msg
    assert "arm ampft: ampft [] in" in msg and "['trainer.length_chunks=1'] in" in msg
    assert "arm trainer seed 1: {'accuracy': 0.81, 'loss': 0.3} in" in msg and "{'accuracy': 0.7, 'loss': 0.3} in" in msg
    assert "arm ampft-bf16 has no run for seed(s) [2]" not in msg  # b measured it
    assert not (tmp_path / "out").exists()  # nothing written
    # A missing seed, and the command line: exit 2 with the reason, not a traceback.
    _fake(monkeypatch, [3], TWO, tmp_path / "d")
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "out"), str(tmp_path / "a"), str(tmp_path / "d"), str(tmp_path / "nowhere")])
    assert exit_.value.code == 2
    assert "nowhere: no readable results.json" in capsys.readouterr().err
    with pytest.raises(BenchmarkConfigError, match=r"arm ampft-bf16 has no run for seed\(s\) \[3\]"):
        combine([tmp_path / "a", tmp_path / "d"], tmp_path / "out")


def test_the_saved_reports_are_what_their_results_render():
    """Every report.md under docs/benchmarks is rendered by this code from the results.json beside it, its
    accuracy statistics summarized again from the raw runs: the numbers the docs cite are reproducible."""
    shared("sst2")
    saved = sorted((ROOT / "docs" / "benchmarks").rglob("results.json"))
    assert len(saved) >= 10
    for path in saved:
        res = json.loads(path.read_text())
        again = resummarize(res)
        assert again["accuracy"]["arms"] == res["accuracy"]["arms"], path
        md = (path.parent / "report.md").read_text()
        assert render(res, re.findall(r"\]\(([a-z_]+\.png)\)", md)) == md, path


def test_percent_scores_are_points_as_they_are_however_small(tmp_path):
    """seqeval's and SQuAD's scores are percent (`Family.scores_in_percent`): an F1 of 0.5 is half a point, not
    50 points as a GLUE fraction would be; so the paired differences of an early NER run are the scores'."""
    from tests.helpers import family_files

    ner = family_files(tmp_path)["ner.txt"]
    b = compose_config("benchmark_recipe", [
        "benchmark.modes=[accuracy]", "benchmark.model=tiny-bert", "benchmark.task=conll2003",
        "benchmark.accuracy.seeds=[1,2]", "benchmark.budget_minutes=null", "benchmark.baseline=fp32",
        f'benchmark.extra=["task.train_file={ner}", "task.validation_file={ner}"]',
        'benchmark.arms=[{name: fp32, overrides: ["precision=fp32"]}, {name: bf16, overrides: ["precision=bf16"]}]',
        "benchmark.accuracy.reference=[fp32]"]).benchmark
    f1 = {("fp32", 1): 0.5, ("fp32", 2): 2.0, ("bf16", 1): 0.6, ("bf16", 2): 1.8}
    runs = [dict(_run(arm, 10.0, f1[arm, seed], precision=arm, seed=seed), main_metric="f1")
            for seed in (1, 2) for arm in ("fp32", "bf16")]
    acc = summarize_accuracy(b, runs, _env(), check(b))
    (check_,) = acc["checks"]
    assert check_["per_seed"] == pytest.approx([0.1, -0.2]) and check_["within"]
    (gain,) = acc["precision_gains"]
    assert gain["metric_difference_per_seed"] == pytest.approx([0.1, -0.2])


def test_combine_leaves_out_an_arm_that_takes_no_part_in_accuracy_mode(tmp_path, monkeypatch):
    """An arm with `modes: [speed]` has no accuracy runs in any directory: it is no arm missing a seed."""
    from ampft.benchmark.combine import combine

    arms = ARMS[:-1] + ', {name: fp16, runner: ampft, overrides: ["precision=fp16"], modes: [speed]}]'
    _fake(monkeypatch, [1], arms, tmp_path / "s1")
    _fake(monkeypatch, [2], arms, tmp_path / "s2")
    combine([tmp_path / "s1", tmp_path / "s2"], tmp_path / "all")
    combined = json.loads((tmp_path / "all" / "results.json").read_text())
    assert [a["arm"] for a in combined["accuracy"]["arms"]] == ["trainer", "ampft", "ampft-bf16"]
    assert combined["benchmark"]["accuracy"]["seeds"] == [1, 2]

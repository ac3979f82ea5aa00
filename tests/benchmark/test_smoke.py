"""The harness for real on CPU: tiny-bert, two arms (fp32, bf16), both modes; every field of
results.json present and plausible, and every output file written."""

from __future__ import annotations

import csv
import json
import math

import pytest

from ampft.benchmark import run_benchmark

SMOKE = [
    "benchmark.model=tiny-bert",
    "benchmark.seq_len=32",
    "benchmark.batch_size=8",
    "benchmark.speed.warmup_steps=1",
    "benchmark.speed.timed_steps=3",
    "benchmark.sweep.batch_sizes=[4,8]",
    "benchmark.accuracy.seeds=[1,2]",
    'benchmark.accuracy.overrides=["trainer.max_steps=6","trainer.log_every=2","checkpoint.export=false",'
    '"task.max_train_samples=64","task.max_eval_samples=32","optim.lr=1e-3"]',
    'benchmark.arms=[{name:fp32,overrides:["precision=fp32"]},{name:bf16,overrides:["precision=bf16"]}]',
    "benchmark.peak_tflops.fp32=1.0",  # so MFU is computed for fp32 and stays null for bf16 on a CPU
    "benchmark.budget_minutes=null",  # every arm in full, however loaded the machine (the budget: test_budget)
]


def finite_positive(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    from tests.helpers import compose_config

    b = compose_config("benchmark_recipe", SMOKE).benchmark
    out = tmp_path_factory.mktemp("bench")
    path = run_benchmark(b, out)
    return out, path, json.loads((out / "results.json").read_text())


def test_outputs_written(smoke):
    out, path, _ = smoke
    assert path == out / "report.md"
    for name in ("report.md", "results.json", "results.csv", "throughput.png", "memory.png", "memory_vs_batch.png",
                 "loss_curves.png", "loss_scale.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    md = path.read_text()
    assert "## Claims" in md and "torch |" in md
    header, row = (line.split(" | ") for line in md.splitlines() if line.startswith(("| arm | precision | attention",
                                                                                     "| `fp32` | fp32 | sdpa |")))
    cells = dict(zip(header, row, strict=True))
    assert cells["time (% of fp32)"] == cells["memory (% of fp32)"] == "100%" and cells["batch×seq"] == "8×32"


def test_results_json_top_level_and_environment(smoke):
    _, _, r = smoke
    assert set(r) == {"benchmark", "environment", "command", "speed", "accuracy", "budget", "claims"}
    assert r["budget"]["minutes"] is None and r["budget"]["cuts"] == [] and r["budget"]["within"] is None
    env = r["environment"]
    for key in ("date", "device_type", "device_name", "cpu", "cpu_count", "torch_threads", "python", "os", "torch",
                "transformers", "accelerate", "load_average"):
        assert env[key] not in (None, ""), key
    assert env["device_type"] == "cpu" and env["driver"] is None
    assert r["benchmark"]["model"] == "tiny-bert" and [a["name"] for a in r["benchmark"]["arms"]] == ["fp32", "bf16"]


def test_speed_raw_fields(smoke):
    _, _, r = smoke
    raw = {a["arm"]: a for a in r["speed"]["raw"]}
    assert set(raw) == {"fp32", "bf16"}
    for name, a in raw.items():
        assert a["precision"] == a["precision_requested"] == name
        assert (a["batch_size"], a["seq_len"], a["attn_implementation"], a["pretrained"]) == (8, 32, "sdpa", False)
        assert len(a["warmup_step_seconds"]) == 1 and len(a["step_seconds"]) == 3
        assert all(finite_positive(s) and s < 60 for s in a["warmup_step_seconds"] + a["step_seconds"])
        assert len(a["losses"]) == 4 and all(0.3 < x < 1.2 for x in a["losses"])  # ~ln 2 for random init
        assert a["skipped_steps"] == 0 and a["loss_scale"] is None
        assert 100 * 2**20 < a["memory_peak"]["peak_rss_bytes"] < 24 * 2**30
        assert a["peak_window"] == "timed+warmup steps"
        assert 0.0 <= a["other_cpu_share"] <= 1.0  # other processes' share of the CPU while the arm ran
        assert a["params_nonembedding"] == 71_362 and a["flops_per_token"] == 6 * 71_362 + 12 * 2 * 32 * 64
        assert [(p["batch_size"], p["fits"]) for p in a["sweep"]] == [(4, True), (8, True)]
        for p in a["sweep"]:
            assert finite_positive(p["step_seconds"]) and finite_positive(p["tokens_per_second"])
            assert finite_positive(p["peak_rss_bytes"])


def test_speed_statistics(smoke):
    _, _, r = smoke
    arms = {a["arm"]: a for a in r["speed"]["arms"]}
    for a in arms.values():
        t = a["step_time"]
        assert t["min"] <= t["q1"] <= t["median"] <= t["q3"] <= t["max"] and t["n"] == 3
        assert a["samples_per_second"]["median"] == pytest.approx(8 / t["median"])
        assert a["tokens_per_second"]["median"] == pytest.approx(8 * 32 / t["median"])
        assert a["tflops"] == pytest.approx(a["flops_per_token"] * a["tokens_per_second"]["median"] / 1e12)
        assert a["peak_memory_kind"] == "cpu_peak_rss" and finite_positive(a["peak_memory_bytes"])
        assert a["peak_reserved_bytes"] is None
        assert finite_positive(a["speedup"]) and finite_positive(a["time_vs_baseline"])
        assert finite_positive(a["memory_vs_baseline"])
    assert arms["fp32"]["speedup"] == 1.0 and arms["fp32"]["memory_vs_baseline"] == 1.0
    assert arms["fp32"]["peak_tflops"] == 1.0 and arms["fp32"]["mfu"] == pytest.approx(arms["fp32"]["tflops"])
    assert arms["bf16"]["peak_tflops"] is None and arms["bf16"]["mfu"] is None  # a CPU: no peak table


def test_accuracy_runs_and_summary(smoke):
    _, _, r = smoke
    runs = r["accuracy"]["runs"]
    assert [(x["arm"], x["seed"]) for x in runs] == [("fp32", 1), ("fp32", 2), ("bf16", 1), ("bf16", 2)]
    for x in runs:
        assert x["precision"] == x["arm"] and not x["diverged"] and x["error"] is None
        assert 0.0 <= x["metric"] <= 1.0 and x["metric"] == x["eval"]["accuracy"] and "f1" in x["eval"]
        assert x["steps"] == 6 and x["skipped_steps"] == 0 and x["loss_scale_final"] is None
        assert [s for s, _, _ in x["loss_curve"]] == [2, 4, 6] and all(0.3 < v < 1.2 for _, v, _ in x["loss_curve"])
        assert x["loss_scale_trace"] == []
        assert finite_positive(x["train_seconds"]) and finite_positive(x["train_samples_per_second"])
        assert x["eval_curve"][-1]["step"] == 6
        assert 0.0 <= x["other_cpu_share"] <= 1.0
    arms = {a["arm"]: a for a in r["accuracy"]["arms"]}
    assert arms["fp32"]["diff"] is None and arms["fp32"]["time_vs_baseline"] == 1.0
    bf16 = arms["bf16"]
    assert bf16["runs"] == 2 and bf16["diverged"] == 0 and bf16["metric"]["n"] == 2
    assert bf16["diff"]["n"] == 2
    assert bf16["diff"]["ci_low"] <= bf16["diff"]["mean"] <= bf16["diff"]["ci_high"]


def test_claims_and_csv(smoke):
    out, _, r = smoke
    claims = {c["id"]: c for c in r["claims"]}
    assert claims["tensor-cores"]["verdict"] == "not checked"  # a CPU
    assert claims["mp-time-bf16"]["verdict"] == "not checked" and "bf16:" in claims["mp-time-bf16"]["measured"]
    assert claims["bf16-stable-bf16"]["verdict"] in {"reproduced", "did not reproduce"}
    assert claims["fp16-scaling"]["verdict"] == "not checked"  # no fp16 arm here
    assert all(c["verdict"] in {"reproduced", "did not reproduce", "not checked"} for c in r["claims"])
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len([x for x in rows if x["quantity"] == "step_seconds" and x["mode"] == "speed"]) == 2 * 3
    assert len([x for x in rows if x["quantity"] == "eval_accuracy"]) == 4
    assert len([x for x in rows if x["mode"] == "sweep" and x["quantity"] == "fits"]) == 4


def test_prediction_next_to_each_speed_arm(smoke):
    """ampft.estimate's prediction for this device beside each measured arm (docs/benchmarks/estimate.md)."""
    out, _, r = smoke
    predicted = r["speed"]["predicted"]
    assert set(predicted) == {"fp32", "bf16"} and all(p["step_seconds"] > 0 for p in predicted.values())
    assert "Predicted by `make estimate`" in (out / "report.md").read_text()


@pytest.mark.parametrize("kind", ["ner", "squad", "stsb"])
def test_speed_mode_trains_each_task_family_on_targets_of_its_shape(kind, tmp_path):
    """A label per token (NER), answer positions (QA), a value (regression): synthetic batches in the family's
    shapes, so the benchmark measures any task, as the fine-tuning it predicts would run."""
    from tests.helpers import compose_config, family_files, family_run_overrides

    overrides = family_run_overrides(kind, family_files(tmp_path / "data"))
    name, task = next(o for o in overrides if o.startswith("task=")), [o for o in overrides if o.startswith("task.")]
    b = compose_config("benchmark_recipe", [
        "benchmark.model=tiny-bert", f"benchmark.{name}", "benchmark.seq_len=48", "benchmark.batch_size=4",
        "benchmark.modes=[speed]", "benchmark.speed.warmup_steps=1", "benchmark.speed.timed_steps=2",
        "benchmark.sweep.batch_sizes=[4]", 'benchmark.arms=[{name:fp32,overrides:["precision=fp32"]}]',
        "benchmark.budget_minutes=null", "benchmark.extra=[" + ",".join(f'"{o}"' for o in task) + "]"]).benchmark
    run_benchmark(b, tmp_path / "bench")
    (raw,) = json.loads((tmp_path / "bench" / "results.json").read_text())["speed"]["raw"]
    assert len(raw["step_seconds"]) == 2 and all(finite_positive(s) for s in raw["step_seconds"])
    assert len(raw["losses"]) == 3 and all(math.isfinite(x) and x > 0 for x in raw["losses"])
    assert [p["fits"] for p in raw["sweep"]] == [True]

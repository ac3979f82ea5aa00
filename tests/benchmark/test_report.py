"""Statistics → claims → report.md, results.csv/json and the PNGs, from hand-made measurements."""

from __future__ import annotations

import csv
import json

import pytest
from PIL import Image

from ampft.benchmark import plots, report, results
from ampft.benchmark.speed import is_oom, sweep_batch_sizes

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _env(device_type="cuda", name="NVIDIA A100-SXM4-80GB"):
    return dict(date="2026-01-01 00:00 UTC", device_type=device_type, device_name=name,
                device_memory_bytes=80 * 2**30, compute_capability="8.0", driver="550.54", cuda="12.4", cudnn=90100,
                cpu="Xeon", cpu_count=32, cpu_features=[], torch_threads=16, load_average=0.1, python="3.11",
                os="Linux", torch="2.13.0", transformers="5.24.0", accelerate="1.15.0")


def _speed_raw(arm, precision, step, mem, attn="sdpa", sweep=(), cuda=True):
    return dict(arm=arm, precision=precision, precision_requested=precision, attn_implementation=attn,
                model="bert-large", pretrained=False, batch_size=32, seq_len=384, device="cuda:0",
                warmup_step_seconds=[step * 3], step_seconds=[step * 0.98, step, step * 1.02, step * 1.5],
                losses=[0.7, 0.69, 0.69, 0.68], skipped_steps=2 if precision == "fp16" else 0, loss_scale=None,
                memory_peak={"peak_allocated_bytes": mem, "peak_reserved_bytes": mem + 2**30} if cuda
                else {"peak_rss_bytes": mem},
                peak_window="timed+warmup steps", params=335_000_000, params_nonembedding=303_000_000,
                n_layers=24, hidden=1024, flops_per_token=1_930_000_000, sweep=list(sweep))


def _run(arm, precision, seed, metric, skipped=0, scale=None, diverged=False):
    return dict(arm=arm, seed=seed, run_dir=f"r/{arm}/{seed}", precision=precision, precision_requested=precision,
                main_metric="accuracy", diverged=diverged, error="boom" if diverged else None,
                metric=None if diverged else metric, eval={} if diverged else {"accuracy": metric, "loss": 0.3},
                train_loss=0.4, train_loss_last=0.2, steps=30, skipped_steps=skipped, loss_scale_final=scale,
                train_seconds=10.0 if precision == "fp32" else 6.0, wall_seconds=12.0,
                train_samples_per_second=100.0, train_tokens_per_second=1000.0,
                loss_curve=[[10, 0.6], [20, 0.4], [30, 0.2]],
                loss_scale_trace=[[10, 32768.0], [20, 16384.0], [30, 16384.0]] if precision == "fp16" else [],
                eval_curve=[{"step": 30, "accuracy": metric}])


def build_results(device_type="cuda", device_name="NVIDIA A100-SXM4-80GB", fp16_acc=(0.90, 0.92, 0.91)):
    env = _env(device_type, device_name)
    cuda = device_type == "cuda"
    mem = dict(peak_allocated_bytes=20 * 2**30, peak_reserved_bytes=21 * 2**30) if cuda else \
        dict(peak_rss_bytes=20 * 2**30)
    sweep32 = [dict(batch_size=32, fits=True, step_seconds=1.0, tokens_per_second=1.0, **mem),
               dict(batch_size=64, fits=False)]
    raw = [_speed_raw("fp32", "fp32", 1.0, 20 * 2**30, sweep=sweep32, cuda=cuda),
           _speed_raw("tf32", "tf32", 0.5, 20 * 2**30, cuda=cuda),
           _speed_raw("fp16", "fp16", 0.28, 11 * 2**30, cuda=cuda),
           _speed_raw("bf16", "bf16", 0.9, 19 * 2**30, cuda=cuda),
           _speed_raw("bf16-eager", "bf16", 0.35, 14 * 2**30, attn="eager", cuda=cuda)]
    b = dict(name="t", modes=["speed", "accuracy"], model="bert-large", task="demo", seq_len=384, batch_size=32,
             seed=42, baseline="fp32", overrides=[], speed=dict(warmup_steps=1, timed_steps=4, overrides=[]),
             sweep=dict(batch_sizes=[32], until_oom=True, max_batch_size=4096, steps=1, arms=None),
             accuracy=dict(seeds=[1, 2, 3], overrides=[]), peak_tflops={},
             arms=[dict(name=r["arm"], overrides=[f"precision={r['precision']}"], modes=None) for r in raw])
    arms = [results.summarize_speed_arm(r, env, None) for r in raw]
    results.add_speed_ratios(arms, "fp32")
    runs = [_run("fp32", "fp32", s, m) for s, m in zip((1, 2, 3), (0.90, 0.92, 0.91), strict=True)]
    runs += [_run("fp16", "fp16", s, m, skipped=3, scale=16384.0) for s, m in zip((1, 2, 3), fp16_acc, strict=True)]
    runs += [_run("bf16", "bf16", s, m) for s, m in zip((1, 2, 3), (0.91, 0.92, 0.90), strict=True)]
    res = dict(benchmark=b, environment=env, command="python recipes/benchmark.py", speed=dict(raw=raw, arms=arms),
               accuracy=results.summarize_accuracy(b, runs, env))
    res["claims"] = results.evaluate_claims(res)
    return res


def test_unknown_gpu_says_peak_unknown_instead_of_a_blank_mfu():
    res = build_results(device_name="NVIDIA B300 SXM6 AC")
    arm = res["speed"]["arms"][0]
    assert arm["mfu"] is None and "set benchmark.peak_tflops.fp32" in arm["peak_tflops_source"]
    text = report.render(res)
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("| arm | precision | attention"))
    col = [c.strip() for c in lines[top].split("|")].index("MFU")
    rows = lines[top + 2:top + 7]
    assert [[c.strip() for c in row.split("|")][col] for row in rows] == ["peak unknown"] * 5
    assert "set benchmark.peak_tflops.bf16" in text


def _claims(res):
    return {c["id"]: c for c in res["claims"]}


def test_speed_statistics_and_ratios():
    res = build_results()
    arms = {a["arm"]: a for a in res["speed"]["arms"]}
    fp32, fp16 = arms["fp32"], arms["fp16"]
    assert fp32["step_time"]["median"] == pytest.approx(1.01)  # median of 0.98, 1.0, 1.02, 1.5
    assert fp32["samples_per_second"]["median"] == pytest.approx(32 / 1.01)
    assert fp32["tokens_per_second"]["median"] == pytest.approx(32 * 384 / 1.01)
    assert fp32["tflops"] == pytest.approx(1.93e9 * 32 * 384 / 1.01 / 1e12)
    assert fp32["peak_tflops"] == 19.5 and fp32["mfu"] == pytest.approx(fp32["tflops"] / 19.5)
    assert fp16["peak_tflops"] == 312.0
    assert fp16["time_vs_baseline"] == pytest.approx(0.28) and fp16["speedup"] == pytest.approx(1 / 0.28)
    assert fp16["memory_vs_baseline"] == pytest.approx(11 / 20)


def test_claims_verdicts_on_a_gpu():
    c = _claims(build_results())
    assert c["mp-time-fp16"]["verdict"] == "reproduced"  # 28% of fp32's time
    assert c["mp-time-bf16"]["verdict"] == "did not reproduce"  # 90%
    assert c["mp-memory-fp16"]["verdict"] == "reproduced"  # 55%
    assert c["mp-memory-bf16"]["verdict"] == "did not reproduce"  # 95%
    assert "mp-time-bf16-eager" not in c  # another attention implementation: not a precision comparison
    assert c["mp-accuracy-fp16"]["verdict"] == "reproduced"
    assert c["tensor-cores-tf32"]["verdict"] == "reproduced"  # 2.0x
    assert c["tensor-cores-bf16"]["verdict"] == "did not reproduce"  # 1.1x
    assert c["tensor-cores-fp16"]["note"] == "more than the claimed 3x"
    assert c["bf16-stable-bf16"]["verdict"] == "reproduced"
    assert c["fp16-scaling-fp16"]["verdict"] == "reproduced"
    assert "9 overflowing steps skipped" in c["fp16-scaling-fp16"]["measured"]
    assert c["anchor-nvidia"]["verdict"] == "reproduced"  # bert-large, 384, 32: fp16/tf32 = 1.79x
    assert c["anchor-hf"]["verdict"] == "not checked"  # seq 512 batch 4 on a V100 is another setting


def test_accuracy_that_differs_does_not_reproduce():
    res = build_results(fp16_acc=(0.80, 0.81, 0.82))
    c = _claims(res)
    assert c["mp-accuracy-fp16"]["verdict"] == "did not reproduce"
    fp16 = next(a for a in res["accuracy"]["arms"] if a["arm"] == "fp16")
    assert fp16["diff"]["mean"] == pytest.approx(-0.1) and fp16["diff"]["ci_high"] < 0
    assert fp16["time_vs_baseline"] == pytest.approx(0.6)


def test_cpu_claims_are_not_checked_where_a_cpu_cannot_check_them():
    c = _claims(build_results("cpu", "Intel Xeon"))
    assert c["tensor-cores"]["verdict"] == "not checked" and "Tensor Cores" in c["tensor-cores"]["note"]
    assert c["mp-time-fp16"]["verdict"] == "not checked" and c["mp-memory-fp16"]["verdict"] == "not checked"
    assert c["bf16-stable-bf16"]["verdict"] == "reproduced"  # numerics: checkable on a CPU


def test_report_renders_the_tables_and_says_what_did_not_reproduce():
    res = build_results()
    md = report.render(res, ["throughput.png"])
    assert "NVIDIA A100-SXM4-80GB" in md and "driver | 550.54" in md and "torch | 2.13.0" in md
    assert "| host CPU | Xeon (32 cores) |" in md and "| CPU features | — |" in md  # the host's, on a GPU too
    assert ("| arm | precision | attention | batch×seq | step ms median [IQR] | time (% of fp32) | samples/s | tokens/s "
            "| TFLOP/s | MFU | peak allocated (reserved) | memory (% of fp32) |") in md
    assert "| `fp16` | fp16 | sdpa | 32×384 | 282.8 [278.6–319.2] | 28% | 113.2 | 43,451 | 83.9 | 27% | " \
           "11,264 MiB (12,288 MiB) | 55% | 2 |" in md
    assert "0.9100 ± 0.0100 (n=3)" in md
    assert ("| Tensor Cores (TF32/FP16/BF16) give 1.5-3x FP32's throughput | **did not reproduce** | bf16: 1.11x fp32 "
            "on this GPU (NVIDIA A100-SXM4-80GB) |  |") in md
    verdicts = [line.split(" | ")[1] for line in md.split("## Claims")[1].splitlines() if line.startswith("| ")][2:]
    assert verdicts == sorted(verdicts, key=["**did not reproduce**", "**not checked**", "**reproduced**"].index)
    assert "| `fp32` | 20,480 MiB | OOM | 32 |" in md  # the sweep: batch 64 did not fit
    assert "![" in md and "(throughput.png)" in md
    assert "**Warning:**" not in md
    busy = build_results("cpu", "Intel Xeon")
    busy["speed"]["raw"][1]["other_cpu_share"] = 0.5
    busy["accuracy"]["runs"][4]["other_cpu_share"] = 0.25
    assert ("**Warning:** other processes used the CPU while these were measured, so their timings are "
            "unreliable: `tf32` (50% of the machine), `fp16` seed 2 (25% of the machine).") in report.render(busy)


def test_json_and_csv_hold_every_raw_measurement(tmp_path):
    res = build_results()
    res["speed"]["raw"][0]["losses"][0] = float("nan")
    report.write_json(res, tmp_path / "results.json")
    back = json.loads((tmp_path / "results.json").read_text())  # strict JSON: NaN written as null
    assert back["speed"]["raw"][0]["losses"][0] is None
    report.write_csv(res, tmp_path / "results.csv")
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    steps = [r for r in rows if r["quantity"] == "step_seconds" and r["mode"] == "speed"]
    assert len(steps) == 5 * 4  # 5 arms x 4 timed steps
    assert {r["quantity"] for r in rows} >= {"warmup_step_seconds", "loss", "peak_allocated_bytes", "fits",
                                              "eval_accuracy", "train_loss_window", "loss_scale", "skipped_steps"}
    assert len([r for r in rows if r["quantity"] == "loss_scale"]) == 3 * 3  # fp16: 3 seeds x 3 points


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_plots_are_valid_pngs(tmp_path, device_type):
    res = build_results(device_type)
    made = plots.make_plots(res, tmp_path)
    assert made == ["throughput.png", "memory.png", "memory_vs_batch.png", "loss_curves.png", "loss_scale.png"]
    for name in made:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == PNG_MAGIC
        with Image.open(tmp_path / name) as img:
            img.verify()
            assert img.size[0] >= 600 and img.size[1] >= 300


def test_plots_without_data_still_explain_themselves(tmp_path):
    from matplotlib.figure import Figure

    res = build_results()
    res["accuracy"]["runs"] = [r for r in res["accuracy"]["runs"] if r["precision"] != "fp16"]
    for r in res["speed"]["raw"]:
        r["sweep"] = []
    assert {"loss_scale.png", "memory_vs_batch.png"} <= set(plots.make_plots(res, tmp_path))
    assert (tmp_path / "loss_scale.png").read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / "memory_vs_batch.png").read_bytes()[:8] == PNG_MAGIC
    ax = Figure().add_subplot()
    assert plots.memory_vs_batch(res, ax) == "no memory sweep (benchmark.sweep.batch_sizes is empty)"
    res["budget"] = {"cuts": [{"arm": "bf16", "mode": "sweep", "action": "skipped", "detail": "no memory sweep"},
                              {"arm": "fp16", "mode": "accuracy", "action": "skipped", "detail": "no runs"}]}
    assert plots.memory_vs_batch(res, ax) == "no memory sweep: cut by the time budget (bf16)"


def test_sweep_doubles_until_out_of_memory():
    fits_up_to = 96

    def try_size(bs):
        return None if bs > fits_up_to else {"peak_allocated_bytes": bs}

    points = sweep_batch_sizes(try_size, [8, 16], until_oom=True, max_batch_size=4096)
    assert [(p["batch_size"], p["fits"]) for p in points] == [(8, True), (16, True), (32, True), (64, True),
                                                              (128, False)]
    assert [p["batch_size"] for p in sweep_batch_sizes(try_size, [8, 16], until_oom=False, max_batch_size=4096)] \
        == [8, 16]
    assert [p["batch_size"] for p in sweep_batch_sizes(try_size, [8], until_oom=True, max_batch_size=32)] \
        == [8, 16, 32]


def test_out_of_memory_is_recognised():
    import torch

    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"))
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_fp16_without_overflow_leaves_its_need_for_scaling_unchecked():
    res = build_results()
    for r in res["accuracy"]["runs"]:
        r["skipped_steps"] = 0
    res["accuracy"] = results.summarize_accuracy(res["benchmark"], res["accuracy"]["runs"], res["environment"])
    c = _claims(dict(res, claims=None) | {"claims": results.evaluate_claims(res)})
    assert c["fp16-scaling-fp16"]["verdict"] == "not checked" and "not exercised" in c["fp16-scaling-fp16"]["note"]

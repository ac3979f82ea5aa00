"""The time budget: the policy on injected step and run times, a real benchmark with a fake slow fp16 arm
(its measured step times replaced, the budget's clock advanced to match), and the report naming what was cut
and why."""

from __future__ import annotations

import json
import time

import pytest

from ampft.benchmark import report, results, run_benchmark, runner, speed
from ampft.benchmark.config import check
from ampft.benchmark.report import fmt_seconds
from tests.benchmark.test_report import build_results

FP32, BF16, FP16 = "fp32", "bf16", "fp16"


def test_fmt_seconds():
    assert fmt_seconds(45.4) == "45 s" and fmt_seconds(185) == "3 min 05 s" and fmt_seconds(None) == "unknown"


@pytest.fixture
def cpu_smoke_run(compose_benchmark, monkeypatch):
    """cpu-smoke's run state on an AVX2-only CPU, its budget on a clock the test sets (`now`)."""
    now = [0.0]
    monkeypatch.setattr(runner, "CLOCK", lambda: now[0])
    b = compose_benchmark().benchmark  # budget 5 min; speed batch 16 x 128; accuracy 1024 samples, batch 32
    env = dict(device_type="cpu", device_name="AMD EPYC", cpu_features=["avx2"])
    return runner._Run(b, check(b), env, runner.Budget(b.budget_minutes)), now


def test_ratio_words_name_the_cpu_and_its_missing_flags(cpu_smoke_run):
    run, _ = cpu_smoke_run
    run.steps.update(fp32=1.0, bf16=0.62, fp16=21.3)
    assert run.slower("fp16") == "fp16: 21x slower than fp32 on this CPU (AMD EPYC) (no AVX512-FP16/AMX-FP16)"
    assert run.slower("bf16").startswith("bf16: 1.6x faster than fp32 on this CPU")
    run.steps["bf16"] = 6.04
    assert run.slower("bf16").startswith("bf16: 6.0x slower than fp32")
    run.steps["bf16"] = 1.02
    assert run.slower("bf16").startswith("bf16: about as fast as fp32") and run.slower("fp32") == (
        "fp32: the baseline on this CPU (AMD EPYC)")


def test_accuracy_runs_are_cut_slowest_arm_first_baseline_last(cpu_smoke_run):
    run, now = cpu_smoke_run
    run.steps.update(fp32=1.0, bf16=0.6, fp16=21.0)
    pending = [(a, s) for s in (2, 3) for a in (FP32, BF16, FP16)]
    done = [dict(arm=a, seed=1) for a in (FP32, BF16)]
    seconds = {FP32: [20.0], BF16: [12.0]}  # fp16: not run yet, projected at 21 x fp32's 20 s
    now[0] = 300 - 100  # 100 s left: fp16's runs (840 s) go; fp32 and bf16 seeds 2 and 3 (64 s) fit
    assert runner._fit_accuracy(run, [(FP16, 1), *pending], seconds, done) == [
        (FP32, 2), (BF16, 2), (FP32, 3), (BF16, 3)]
    [cut] = run.budget.cuts
    assert (cut["arm"], cut["mode"], cut["action"], cut["detail"]) == (FP16, "accuracy", "skipped", "no accuracy runs")
    assert cut["reason"] == ("fp16: 21x slower than fp32 on this CPU (AMD EPYC) (no AVX512-FP16/AMX-FP16): its 3 "
                             "remaining accuracy runs would take ~21 min 00 s, with 1 min 40 s of the budget left "
                             "for 7 runs") and cut["at_seconds"] == 200
    now[0] = 300 - 30  # 30 s left: bf16 loses seeds 3 and 2 (the slowest arm first, the baseline last), fp32 seed 3
    assert runner._fit_accuracy(run, pending[:2] + pending[3:5], seconds, done) == [(FP32, 2)]
    assert [(c["arm"], c["action"], c["detail"]) for c in run.budget.cuts[1:]] == [
        (FP32, "shortened", "seeds [1, 2] of [1, 2, 3]"), (BF16, "shortened", "seeds [1] of [1, 2, 3]")]
    now[0] = 300 - 10  # even fp32's seed 2 does not fit: it goes too
    assert runner._fit_accuracy(run, [(FP32, 2)], seconds, done) == []
    assert run.budget.cuts[-1]["arm"] == FP32 and run.budget.cuts[-1]["detail"] == "seeds [1] of [1, 2, 3]"


def test_first_accuracy_run_is_bounded_from_the_speed_step(cpu_smoke_run):
    run, now = cpu_smoke_run
    cfg = run.cfgs[("accuracy", "fp32", 1)]
    assert runner._first_run_bound(run, cfg) is None  # no speed-mode step time yet
    run.steps["fp32"] = 0.78
    seconds, what = runner._first_run_bound(run, cfg)
    assert what == "32 steps of 32 x up to 128 tokens" and seconds == pytest.approx(32 * 0.78 * 2)
    pending = [(a, 1) for a in (FP32, BF16, FP16)]
    now[0] = 300 - 60  # 60 s left: the first run (up to ~50 s) runs, and nothing else is projected before it
    assert runner._fit_accuracy(run, pending, {}, []) == pending and run.budget.cuts == []
    now[0] = 300 - 40
    assert runner._fit_accuracy(run, pending, {}, []) == []
    [cut] = run.budget.cuts
    assert cut["arm"] == "fp32, bf16, fp16" and cut["detail"] == "no accuracy runs"
    assert "the first accuracy run (fp32, 32 steps of 32 x up to 128 tokens) could take up to ~50 s" in cut["reason"]


def test_first_run_bound_scales_from_the_batch_the_baseline_was_timed_at(compose_benchmark, monkeypatch):
    """A baseline arm with its own trainer.batch_size: its speed-mode step is of that batch, not benchmark.batch_size's."""
    monkeypatch.setattr(runner, "CLOCK", lambda: 0.0)
    b = compose_benchmark(['benchmark.arms=[{name: fp32, overrides: ["precision=fp32", "trainer.batch_size=4"]}, '
                           '{name: bf16, overrides: ["precision=bf16"]}]']).benchmark
    run = runner._Run(b, check(b), dict(device_type="cpu", device_name="AMD EPYC", cpu_features=[]), runner.Budget(5))
    run.steps["fp32"] = 0.2  # a step of 4 x 128 tokens, as are accuracy mode's (the arm's override comes last)
    seconds, what = runner._first_run_bound(run, run.cfgs[("accuracy", "fp32", 1)])
    assert what == "256 steps of 4 x up to 128 tokens" and seconds == pytest.approx(256 * 0.2)



def test_a_skipped_speed_arm_names_the_batch_of_its_own_pilot_steps(compose_benchmark, monkeypatch, tmp_path):
    b = compose_benchmark(['benchmark.arms=[{name: fp32, overrides: ["precision=fp32"]}, '
                           '{name: bf16, overrides: ["precision=bf16", "trainer.batch_size=64"]}]']).benchmark
    run = runner._Run(b, check(b), dict(device_type="cpu", device_name="AMD EPYC", cpu_features=[]), runner.Budget(5))
    monkeypatch.setattr(runner, "measure_arm", lambda cfg, *a, **k: dict(
        batch_size=cfg.trainer.batch_size, pilot_step_seconds=9.0, projected_step_seconds=36.0, skipped=True))
    monkeypatch.setattr(runner, "predict_arms", lambda *a: {})
    runner._speed_mode(run, [b.arms[1]], tmp_path)
    assert run.budget.cuts[0]["detail"] == "pilot steps only (9.00 s a step at batch 16)"  # a quarter of 64, not of 16


def test_budget_records_cuts_against_its_clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(runner, "CLOCK", lambda: now[0])
    b = runner.Budget(2)
    now[0] += 50
    assert b.elapsed() == 50 and b.left() == 70 and b.left(0.25) == pytest.approx(-20)
    b.cut(FP16, "accuracy", "skipped", "no accuracy runs", "fp16: 21x slower than fp32")
    now[0] += 80
    s = b.summary()
    assert s["minutes"] == 2 and s["seconds_used"] == 130 and s["within"] is False
    assert s["cuts"] == [dict(arm=FP16, mode="accuracy", action="skipped", detail="no accuracy runs",
                              reason="fp16: 21x slower than fp32", at_seconds=50.0)]
    assert runner.Budget(None).left() == float("inf") and runner.Budget(None).summary()["within"] is None


# --- a real benchmark with a fake slow arm ----------------------------------------------------------

FP16_STEP = 30.0  # injected: seconds a full-batch (8-row) fp16 step "takes"; a pilot step (2 rows) 1/4 of it
OTHER_STEP = 0.1  # injected for fp32 and bf16 alike, so that no projection hangs on tiny-bert's noisy timings
ACCURACY_RUN = 2.0  # injected: seconds each accuracy run adds to the budget's clock

SLOW = [
    "benchmark.model=tiny-bert",
    "benchmark.seq_len=32",
    "benchmark.batch_size=8",
    "benchmark.budget_minutes=10",
    "benchmark.speed.warmup_steps=1",
    "benchmark.speed.timed_steps=10",
    "benchmark.sweep.batch_sizes=[4,8]",
    "benchmark.accuracy.seeds=[1,2]",
    'benchmark.accuracy.overrides=["trainer.max_steps=6","trainer.log_every=2","checkpoint.export=false",'
    '"task.max_train_samples=64","task.max_eval_samples=32","optim.lr=1e-3"]',
]


@pytest.fixture(scope="module")
def slow_fp16(tmp_path_factory):
    """cpu-smoke's three arms on tiny-bert, the fp16 arm's steps reported as FP16_STEP seconds each (the
    others' as OTHER_STEP) and the budget's clock advanced by the difference, as if this CPU crawled under fp16
    (no real slow run). Each
    accuracy run also counts ACCURACY_RUN seconds, so that the fp16 runs' projection (a baseline run's time
    x fp16's step-time ratio) does not hang on how fast tiny-bert's half-second runs happen to be. The clock
    advances at a tenth of real time otherwise, so a loaded test machine does not change what gets cut."""
    from ampft.benchmark import runner
    from tests.helpers import compose_config

    mp = pytest.MonkeyPatch()
    extra = [0.0]
    real_steps, real_seed = speed._run_steps, runner.run_seed

    def counted_seed(*args, **kwargs):
        extra[0] += ACCURACY_RUN
        return real_seed(*args, **kwargs)

    mp.setattr(runner, "run_seed", counted_seed)

    def fake_steps(loop, batches):
        seconds, losses, skipped = real_steps(loop, batches)
        step = FP16_STEP if loop.cfg.precision.name.value == FP16 else OTHER_STEP
        fake = [step * b["input_ids"].shape[0] / 8 for b in batches]
        extra[0] += sum(fake) - sum(seconds)
        return fake, losses, skipped

    mp.setattr(speed, "_run_steps", fake_steps)
    start = time.monotonic()
    mp.setattr(runner, "CLOCK", lambda: start + (time.monotonic() - start) / 10 + extra[0])
    try:
        b = compose_config("benchmark_recipe", SLOW).benchmark
        out = tmp_path_factory.mktemp("slow")
        path = run_benchmark(b, out)
    finally:
        mp.undo()
    return path.read_text(), json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_slow_arm_is_measured_then_cut_and_the_budget_kept(slow_fp16):
    _, r = slow_fp16
    bud = r["budget"]
    assert bud["minutes"] == 10 and bud["within"] is True and bud["seconds_used"] <= 600
    cuts = {(c["arm"], c["mode"]): c for c in bud["cuts"]}
    assert set(cuts) == {(FP16, "sweep"), (FP16, "speed"), (FP16, "accuracy")}  # fp32 and bf16 untouched
    # speed: the probe ran (warm-up + 2 timed steps), then the timed steps that fitted; no room for the sweep
    raw = {a["arm"]: a for a in r["speed"]["raw"]}
    assert raw[FP16]["step_seconds"][:2] == [FP16_STEP, FP16_STEP] and raw[FP16]["sweep"] == []
    n = len(raw[FP16]["step_seconds"])
    assert 2 <= n < 10 and cuts[(FP16, "speed")] == dict(cuts[(FP16, "speed")], action="shortened",
                                                          detail=f"{n} of 10 timed steps")
    assert len(raw[FP32]["step_seconds"]) == len(raw[BF16]["step_seconds"]) == 10
    assert [p["batch_size"] for p in raw[BF16]["sweep"]] == [4, 8]
    # accuracy: fp16 skipped before any run of its own, because of its measured ratio; fp32/bf16 paired
    acc = cuts[(FP16, "accuracy")]
    assert acc["action"] == "skipped" and acc["detail"] == "no accuracy runs"
    ratio = bud["step_time_vs_baseline"][FP16]
    assert ratio > 100 and f"fp16: {ratio:.0f}x slower than fp32 on this CPU" in acc["reason"]
    assert "its 2 remaining accuracy runs would take" in acc["reason"]
    assert [(x["arm"], x["seed"]) for x in r["accuracy"]["runs"]] == [(FP32, 1), (FP32, 2), (BF16, 1), (BF16, 2)]
    assert [a["arm"] for a in r["accuracy"]["arms"]] == [FP32, BF16]
    assert set(bud["pilot_step_seconds"]) == {FP32, BF16, FP16} and bud["pilot_step_seconds"][FP16] == FP16_STEP / 4


@pytest.mark.slow
def test_report_says_what_was_cut_and_why(slow_fp16):
    md, r = slow_fp16
    assert "**Time budget:** 10 min 00 s; took " in md and ", within it. Cut to keep it: " in md
    assert "`fp16` accuracy skipped (no accuracy runs)" in md and "`fp16` sweep skipped (no memory sweep)" in md
    assert "## Time budget" in md and "| `fp16` | accuracy | skipped | no accuracy runs | fp16: " in md
    assert "Step time relative to `fp32`" in md and "`fp16` " in md
    if "avx512_fp16" not in r["environment"]["cpu_features"]:
        assert "on this CPU (" in md and "(no AVX512-FP16/AMX-FP16)" in md  # the CPU flags say why


def test_report_of_an_arm_cut_entirely_and_a_budget_overrun():
    res = build_results("cpu", "AMD EPYC")
    res["environment"]["cpu_features"] = ["avx2"]
    res["speed"]["raw"] = [x for x in res["speed"]["raw"] if x["arm"] != "fp16"]
    res["speed"]["arms"] = [x for x in res["speed"]["arms"] if x["arm"] != "fp16"]
    res["accuracy"]["runs"] = [x for x in res["accuracy"]["runs"] if x["arm"] != "fp16"]
    res["accuracy"] = results.summarize_accuracy(res["benchmark"], res["accuracy"]["runs"], res["environment"])
    res["budget"] = dict(minutes=5, seconds_used=412.0, within=False,
                         pilot_step_seconds={"fp32": 0.1, "fp16": 2.1}, step_time_vs_baseline={"fp16": 21.0},
                         cuts=[dict(arm="fp16", mode="speed", action="skipped", detail="pilot steps at batch 4 "
                                    "only (2.10 s a step)", reason="fp16: 21x slower than fp32 on this CPU (AMD EPYC) "
                                    "(no AVX512-FP16/AMX-FP16) in its pilot steps", at_seconds=30.0)])
    md = report.render(res)
    assert "**Time budget:** 5 min 00 s; took 6 min 52 s, **over it**." in md
    assert "Not measured (cut by the time budget): `fp16`." in md
    assert "| `fp16` | speed | skipped | pilot steps at batch 4 only (2.10 s a step) | fp16: 21x slower" in md
    del res["budget"]  # a results.json from before the budget still renders
    assert "Time budget" not in report.render(res)

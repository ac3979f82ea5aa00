"""The time budget: the policy on injected step and run times, a real benchmark with a fake slow fp16 arm
(its measured step times replaced, the budget's clock advanced to match), and the report naming what was cut
and why."""

from __future__ import annotations

import json
import time

import pytest

from ampft.benchmark import budget, report, results, run_benchmark, speed
from tests.benchmark.test_report import build_results

FP32, BF16, FP16 = "fp32", "bf16", "fp16"


def test_fmt_and_ratio_words():
    assert budget.fmt_seconds(45.4) == "45 s" and budget.fmt_seconds(185) == "3 min 05 s"
    assert budget.fmt_seconds(None) == "unknown"
    assert budget.slower(21.3, FP32) == "21x slower than fp32" and budget.slower(6.04, FP32) == "6.0x slower than fp32"
    assert budget.slower(0.62, FP32) == "1.6x faster than fp32" and budget.slower(1.0, FP32) == "about as fast as fp32"


def test_speed_arm_loses_its_sweep_then_timed_steps():
    # 1 s a step, 6 more steps, a 3 s sweep: all of it fits in 10 s, with 2 s kept for later arms
    assert budget.fit_after_probe(left=11, step=1.0, more_steps=6, sweep=3, reserve=2) == (6, True)
    assert budget.fit_after_probe(left=10, step=1.0, more_steps=6, sweep=3, reserve=2) == (6, False)  # no sweep
    assert budget.fit_after_probe(left=6.5, step=1.0, more_steps=6, sweep=3, reserve=2) == (4, False)
    assert budget.fit_after_probe(left=1, step=1.0, more_steps=6, sweep=3, reserve=2) == (0, False)  # probe only
    assert budget.sweep_cost(2.0, 16, [4, 8, 16, 32], 1) == pytest.approx(2.0 * 60 / 16)
    assert budget.fit_after_pilot(left=100, step=20, first_steps=4, reserve=10)
    assert not budget.fit_after_pilot(left=100, step=30, first_steps=4, reserve=10)


def test_accuracy_runs_go_seed_by_seed_baseline_first():
    assert budget.seed_major([BF16, FP32, FP16], [1, 2], FP32) == [
        (FP32, 1), (BF16, 1), (FP16, 1), (FP32, 2), (BF16, 2), (FP16, 2)]


def test_accuracy_policy_skips_the_slowest_arm_first():
    # after fp32 seed 1 (20 s): bf16 at 0.6x, fp16 at 21x fp32's step time
    per_run = {FP32: 20.0, BF16: 12.0, FP16: 420.0}
    pending = budget.seed_major([FP32, BF16, FP16], [1, 2, 3], FP32)[1:]
    keep, drops = budget.plan_accuracy(200, pending, per_run, FP32, seeds_done={1})
    assert drops == [("arm", FP16)]
    assert keep == [(BF16, 1), (FP32, 2), (BF16, 2), (FP32, 3), (BF16, 3)]
    # everything fits: nothing dropped
    assert budget.plan_accuracy(10_000, pending, per_run, FP32, {1}) == (pending, [])


def test_accuracy_policy_then_drops_seeds_then_the_last_arm():
    per_run = {FP32: 20.0, BF16: 30.0, FP16: 40.0}
    pending = budget.seed_major([FP32, BF16, FP16], [1, 2, 3, 4], FP32)[1:]
    # 105 s: fp16 goes, then seeds 4 and 3 (pairs kept), leaving bf16 1, fp32 2, bf16 2 = 80 s
    keep, drops = budget.plan_accuracy(105, pending, per_run, FP32, {1})
    assert drops == [("arm", FP16), ("seed", 4), ("seed", 3)]
    assert keep == [(BF16, 1), (FP32, 2), (BF16, 2)]
    # 25 s: not even two seeds of bf16 fit; bf16 goes, and the baseline's runs with it (nothing to compare)
    keep, drops = budget.plan_accuracy(25, pending, per_run, FP32, {1})
    assert drops == [("arm", FP16), ("seed", 4), ("seed", 3), ("arm", BF16), ("arm", FP32)] and keep == []
    # a single arm: seeds down to one, then what is left runs over the budget
    keep, drops = budget.plan_accuracy(5, [(FP32, 1), (FP32, 2), (FP32, 3)], {FP32: 20.0}, FP32, set())
    assert drops == [("seed", 3), ("seed", 2)] and keep == [(FP32, 1)]


def test_first_accuracy_run_is_bounded_from_the_speed_step(compose_benchmark):
    from ampft.benchmark.config import check
    from ampft.benchmark.runner import _first_run_bound, _Run

    b = compose_benchmark().benchmark  # cpu-smoke: speed batch 16 x 128; accuracy 1024 samples, batch 32
    cfgs = check(b)
    run = _Run(b, cfgs, dict(device_type="cpu", device_name="AMD EPYC"), budget.Budget(b.budget_minutes))
    cfg = cfgs[("accuracy", "fp32", 1)]
    assert _first_run_bound(run, cfg) is None  # no speed-mode step time yet
    run.steps["fp32"] = 0.78
    seconds, what = _first_run_bound(run, cfg)
    assert what == "32 steps of 32 x up to 128 tokens" and seconds == pytest.approx(32 * 0.78 * 2)


def test_budget_records_cuts_against_its_clock():
    now = [100.0]
    b = budget.Budget(2, clock=lambda: now[0])
    now[0] += 50
    assert b.elapsed() == 50 and b.left() == 70 and b.left(0.25) == pytest.approx(-20)
    b.cut(FP16, "accuracy", "skipped", "no accuracy runs", "fp16: 21x slower than fp32")
    now[0] += 80
    s = b.summary()
    assert s["minutes"] == 2 and s["seconds_used"] == 130 and s["within"] is False
    assert s["cuts"] == [dict(arm=FP16, mode="accuracy", action="skipped", detail="no accuracy runs",
                              reason="fp16: 21x slower than fp32", at_seconds=50.0)]
    assert budget.Budget(None).left() == float("inf") and budget.Budget(None).summary()["within"] is None


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
    mp.setattr(budget, "CLOCK", lambda: start + (time.monotonic() - start) / 10 + extra[0])
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
    # speed: the probe ran (warm-up + 2 timed steps), the sweep went first, then timed steps
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
    assert ratio > 1 and f"{budget.slower(ratio, FP32)} on this CPU" in acc["reason"]
    assert "speed measured, its 2 remaining accuracy runs would take" in acc["reason"]
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
    res["budget"] = dict(minutes=5, seconds_used=412.0, within=False, speed_share=budget.SPEED_SHARE,
                         pilot_step_seconds={"fp32": 0.1, "fp16": 2.1}, step_time_vs_baseline={"fp16": 21.0},
                         cuts=[dict(arm="fp16", mode="speed", action="skipped", detail="pilot steps at batch 4 "
                                    "only (2.10 s a step)", reason="fp16: 21x slower than fp32 on this CPU (AMD EPYC) "
                                    "(no AVX512-FP16/AMX-FP16) in its pilot steps", at_seconds=30.0)])
    md = report.render(res)
    assert "**Time budget:** 5 min 00 s; took 6 min 52 s, **over it**." in md
    assert "| `fp16` | — | skipped by the time budget (see above) |" in md
    assert "| `fp16` | speed | skipped | pilot steps at batch 4 only (2.10 s a step) | fp16: 21x slower" in md
    del res["budget"]  # a results.json from before the budget still renders
    assert "Time budget" not in report.render(res)

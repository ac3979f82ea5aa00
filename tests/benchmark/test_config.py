"""Benchmark configs: every file composes and checks; unknown keys fail at compose time; problems are all
reported at once, each naming its key."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from ampft.benchmark import BenchmarkConfigError, check
from ampft.benchmark.config import Mode, arm_overrides, arms_for, compose_finetune
from tests.helpers import CONF, shared

BENCHMARKS = sorted(p.stem for p in (CONF / "benchmark").glob("*.yaml"))


def test_default_is_cpu_smoke(compose_benchmark):
    b = compose_benchmark().benchmark
    assert b.name == "cpu-smoke" and b.model == "minilm-l6"
    assert {"fp32", "bf16"} <= {a.name for a in b.arms}


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_config_composes_and_checks(compose_benchmark, name):
    # The comparisons with the Trainer train on SST-2 (from ../shared); random weights: bert-large is not here.
    offline = ['benchmark.extra=["model.pretrained=false"]'] if name.startswith("peer-") and shared("sst2") else []
    b = compose_benchmark([f"benchmark={name}", *offline]).benchmark
    assert b.name == name
    cfgs = check(b)  # composes and validates every arm of every mode
    assert {arm for _, arm, _ in cfgs} == {a.name for a in b.arms}
    for (mode, _, seed), cfg in cfgs.items():
        assert cfg.trainer.seed == (b.seed if mode == "speed" else seed)


def test_gpu_table_arms(compose_benchmark):
    b = compose_benchmark(["benchmark=bert-large-seq384"]).benchmark
    cfgs = check(b)
    speed = {arm: cfg for (mode, arm, _), cfg in cfgs.items() if mode == "speed"}
    assert set(speed) == {"fp32", "tf32", "fp16", "bf16", "fp16-eager", "bf16-eager"}
    for cfg in speed.values():
        assert (cfg.model.name, cfg.task.max_length, cfg.trainer.batch_size) == ("bert-large", 384, 32)
        assert cfg.model.pretrained is False  # offline by construction
    assert speed["bf16-eager"].model.attn_implementation.value == "eager"
    assert speed["bf16"].model.attn_implementation.value == "sdpa"
    assert speed["fp32"].precision.name.value == "fp32"


def test_unknown_key_fails_at_compose_time(compose_benchmark):
    with pytest.raises(ConfigCompositionException) as err:
        compose_benchmark(["benchmark.speed.timed_step=5"])
    assert "timed_step" in str(err.value.__cause__ or err.value)
    with pytest.raises(ConfigCompositionException):
        compose_benchmark(["benchmark.modes=[speed,sped]"])


def test_all_problems_reported_together(compose_benchmark):
    b = compose_benchmark([
        "benchmark.baseline=fp64", "benchmark.speed.timed_steps=1", "benchmark.sweep.batch_sizes=[8,4]",
        "benchmark.arms=[{name:fp32,overrides:[\"precision=fp99\"]},{name:bf16,overrides:[\"trainer.batch_sise=3\"]},"
        "{name:hf,runner:trainer}]", "benchmark.extra=[\"trainer.seed=3\"]",
    ]).benchmark
    with pytest.raises(BenchmarkConfigError) as err:
        check(b)
    msg = str(err.value)
    assert "benchmark.baseline=fp64 is not an arm" in msg
    assert "benchmark.speed.timed_steps=1" in msg
    assert "benchmark.sweep.batch_sizes=[8, 4]" in msg
    assert "benchmark.arms[0] (fp32, speed mode)" in msg and "fp99" in msg
    assert "benchmark.arms[1] (bf16, speed mode)" in msg and "batch_sise" in msg
    assert "benchmark.arms[2] (hf): runner=trainer in speed mode, which times ampft's own step: give the arm " \
        "modes: [accuracy]" in msg
    assert "benchmark.extra: trainer.seed=3 would give every run one seed: the seeds are benchmark.seed (speed " \
        "mode) and benchmark.accuracy.seeds" in msg


def test_each_seeds_config_is_the_one_its_overrides_compose(compose_benchmark):
    """check composes and validates an arm once; its other seeds' configs are that one with their trainer.seed."""
    b = compose_benchmark().benchmark
    cfgs = check(b)
    for arm in arms_for(b, Mode.accuracy):
        for seed in b.accuracy.seeds[1:]:
            composed = compose_finetune(arm_overrides(b, arm, Mode.accuracy, seed))
            assert OmegaConf.to_container(cfgs[("accuracy", arm.name, seed)]) == OmegaConf.to_container(composed)


def test_arm_overrides_order_and_mode_membership(compose_benchmark):
    b = compose_benchmark(["benchmark.arms=[{name:fp32,overrides:[\"precision=fp32\"]},"
                           "{name:fp16,overrides:[\"precision=fp16\"],modes:[speed]}]"]).benchmark
    assert [a.name for a in arms_for(b, Mode.accuracy)] == ["fp32"]
    assert [a.name for a in arms_for(b, Mode.speed)] == ["fp32", "fp16"]
    o = arm_overrides(b, b.arms[1], Mode.speed)
    assert o[:2] == ["model=minilm-l6", "task=demo"] and o[-1] == "precision=fp16"
    assert "model.pretrained=false" in o  # speed mode: random init
    assert "trainer.seed=7" in arm_overrides(b, b.arms[0], Mode.accuracy, seed=7)


def test_seq_len_is_checked_against_the_model_by_validate_alone(compose_benchmark):
    """One position check (ampft.config's, through validate): benchmark.seq_len becomes task.max_length."""
    common = ["benchmark.model=tiny-bert", "benchmark.modes=[speed]", "benchmark.seq_len=600"]
    with pytest.raises(BenchmarkConfigError) as err:
        check(compose_benchmark(common).benchmark)
    assert "task.max_length=600: model=tiny-bert has 512 positions; use task.max_length <= 512" in str(err.value)
    # Relative positions (DeBERTa's position_biased_input=false) have no such limit: accepted.
    b = compose_benchmark([*common, "benchmark.overrides=[\"logging=none\",\"+model.arch.position_biased_input=false\"]"])
    assert {cfg.task.max_length for cfg in check(b.benchmark).values()} == {600}


def test_profile_steps_without_isolated_runs_is_refused_not_ignored(compose_benchmark):
    """Only runs in their own process are profiled: cpu-smoke's in-process ampft arms would get no profile and
    no word about it."""
    tiny = ["benchmark.model=tiny-bert", "benchmark.accuracy.profile_steps=20"]
    with pytest.raises(BenchmarkConfigError, match=r"profile_steps=20 profiles the runs that have their own process: "
                                                   r"add benchmark.accuracy.isolate=true"):
        check(compose_benchmark(tiny).benchmark)
    check(compose_benchmark([*tiny, "benchmark.accuracy.isolate=true"]).benchmark)

"""The learning-rate schedule `finetune.build` makes from the scheduler group: every option honours its warm-up."""

from __future__ import annotations

import pytest

from ampft.finetune import build, reset_accelerate


@pytest.mark.parametrize("name", ["linear", "cosine", "constant"])
def test_every_schedule_warms_up_over_warmup_steps(tiny, tmp_path, name):
    training, _, _ = build(tiny(f"scheduler={name}", "scheduler.warmup_steps=4", "trainer.max_steps=20",
                                "optim.lr=1e-3"), tmp_path)
    try:
        sched = training.scheduler.scheduler
        factors = [sched.lr_lambdas[0](step) for step in range(6)]
        assert factors[:5] == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])
        assert factors[5] == pytest.approx(1.0) if name == "constant" else factors[5] < 1.0
    finally:
        training.tracker.close()
        reset_accelerate()

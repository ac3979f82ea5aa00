"""trainer.early_stopping_patience: N evaluations without improvement of the watched metric end training; the best
evaluation is recorded in summary.json and, with checkpoint.export_best, exported; the count survives a kill."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from ampft.checkpointing import manifest
from ampft.config import ConfigError
from ampft.engine import TrainState, track_best
from ampft.finetune import run
from ampft.validation import validate
from tests.helpers import ROOT, TINY

# tiny-bert from random weights on the demo task sits at the majority class for a few hundred steps (see
# tests/e2e/test_finetune.py): its accuracy does not improve after the first evaluation.
STOPS = ["trainer.max_steps=200", "trainer.eval_every=4", "trainer.early_stopping_patience=2"]
BEST = ["checkpoint.every=4", "checkpoint.keep_best=1", "checkpoint.keep_last=1", "checkpoint.export_best=true"]


def _evals(run_dir) -> list[dict]:
    events = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [e for e in events if e["event"] == "eval"]


def _expected_stop(evals: list[dict], metric: str, mode: str, patience: int) -> tuple[int, int]:
    """(stop step, best step) of a list of logged evaluations, counted independently of the engine."""
    best, best_step, since = None, None, 0
    for e in evals:
        v = e[metric]
        if math.isfinite(v) and (best is None or (v > best if mode == "max" else v < best)):
            best, best_step, since = v, e["step"], 0
        else:
            since += 1
            if since == patience:
                return e["step"], best_step
    raise AssertionError(f"never stopped: {evals}")


def test_the_count_resets_on_strict_improvement_only():
    st = TrainState()
    seen = []
    for step, acc in [(1, 0.5), (2, 0.5), (3, 0.6), (4, float("nan")), (5, 0.55), (6, 0.7), (7, 0.7)]:
        st.step = step
        seen.append((track_best(st, {"accuracy": acc, "loss": 1.0}, "accuracy", "max"), st.evals_since_best))
    assert seen == [(True, 0), (False, 1), (True, 0), (False, 1), (False, 2), (True, 0), (False, 1)]
    assert (st.best_step, st.best_eval["accuracy"]) == (6, 0.7)
    st = TrainState()
    for step, loss in [(1, 0.9), (2, 0.8), (3, 0.85)]:
        st.step = step
        track_best(st, {"loss": loss}, "loss", "min")
    assert (st.best_step, st.best_eval, st.evals_since_best) == (2, {"loss": 0.8}, 1)
    TrainState().load_state_dict(json.loads(json.dumps(st.state_dict())))  # checkpointed as JSON, read back


def test_a_run_that_stops_improving_stops_and_exports_its_best_checkpoint(tiny, tmp_path):
    summary = run(tiny(*STOPS, *BEST), tmp_path)
    evals = _evals(tmp_path)
    stop, best = _expected_stop(evals, "accuracy", "max", 2)
    assert summary["steps"] == stop < 200 and evals[-1]["step"] == stop  # no evaluation after the stop
    assert summary["early_stopping"] == dict(
        patience=2, metric="accuracy", mode="max", stopped=True, stopped_step=stop, best_step=best,
        best_value=next(e["accuracy"] for e in evals if e["step"] == best), evaluations_without_improvement=2)
    assert json.loads((tmp_path / "summary.json").read_text())["early_stopping"] == summary["early_stopping"]
    # The export is the best checkpoint's weights, byte for byte, not the last step's.
    assert summary["exported"].startswith(f"best: step_{best} ")
    ckpt = tmp_path / "checkpoints" / f"step_{best}"
    assert manifest(ckpt)["metric"] == {"name": "accuracy", "value": summary["early_stopping"]["best_value"]}
    exported, saved = load_file(tmp_path / "model" / "model.safetensors"), load_file(ckpt / "model.safetensors")
    assert exported.keys() == saved.keys() and all(exported[k].equal(saved[k]) for k in saved)


def test_without_export_best_the_last_weights_are_exported_and_the_user_is_told(tiny, tmp_path):
    cfg = tiny(*STOPS)
    assert any("not the best" in w and "checkpoint.export_best=true" in w for w in validate(cfg))
    summary = run(cfg, tmp_path)
    early = summary["early_stopping"]
    assert early["stopped"] and summary["steps"] == early["stopped_step"] > early["best_step"]
    assert summary["exported"] == f"last (step {early['stopped_step']})"


def test_off_by_default_and_recorded_as_off(tiny, tmp_path):
    summary = run(tiny("trainer.max_steps=12", "trainer.eval_every=4"), tmp_path)
    assert summary["steps"] == 12 and summary["early_stopping"] is None
    assert [e["step"] for e in _evals(tmp_path)] == [4, 8, 12]


@pytest.mark.parametrize("overrides,message", [
    (["trainer.early_stopping_patience=-1"], "trainer.early_stopping_patience=-1: must be >= 1"),
    (["trainer.max_steps=12", "trainer.eval_every=4"], "evaluates 2 time(s) before its last step"),
    (["trainer.eval_every=0", *BEST], "every evaluation needs one"),
    (["trainer.eval_every=4", *BEST, "checkpoint.every=8"], "every evaluation needs one"),
    (["trainer.eval_every=4", *BEST, "checkpoint.keep_best=0"], "set checkpoint.keep_best=1"),
])
def test_combinations_that_cannot_work_are_refused_up_front(tiny, overrides, message):
    with pytest.raises(ConfigError) as err:
        validate(tiny("trainer.early_stopping_patience=2", *overrides))
    assert message in str(err.value)


def test_too_few_epoch_end_evaluations_are_refused_once_the_steps_are_known(tiny, tmp_path):
    """trainer.eval_every=0 evaluates at epoch ends: how many steps an epoch has is known once the data is."""
    with pytest.raises(ConfigError, match=r"evaluates 1 time\(s\) before its last step \(80 steps, every epoch"):
        run(tiny("trainer.epochs=2", "trainer.early_stopping_patience=1"), tmp_path)


def _recipe(run_dir, *overrides) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "recipes/finetune.py", *overrides, f"hydra.run.dir={run_dir}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_killed_in_the_middle_of_its_patience_a_resumed_run_stops_where_the_uninterrupted_one_did(tmp_path):
    """SIGKILL after a checkpoint taken while the count of evaluations without improvement is above 0: the resumed
    run stops at the same step, with the same best checkpoint exported, as the run that was never killed."""
    args = [*TINY, "trainer.max_steps=400", "trainer.eval_every=10", "trainer.early_stopping_patience=4",
            "trainer.log_every=1", *BEST, "checkpoint.every=10", "checkpoint.keep_last=2"]
    reference = subprocess.run([sys.executable, "recipes/finetune.py", *args, f"hydra.run.dir={tmp_path / 'ref'}"],
                               cwd=ROOT, capture_output=True, text=True)
    assert reference.returncode == 0, reference.stderr[-2000:]
    ref = json.loads((tmp_path / "ref" / "summary.json").read_text())
    early = ref["early_stopping"]
    assert early["stopped"] and early["stopped_step"] < 400
    # Kill one step after the first checkpoint whose evaluation did not improve (the count is 1 there).
    evals = _evals(tmp_path / "ref")
    after = [e["step"] for i, e in enumerate(evals) if i and e["accuracy"] <= max(x["accuracy"] for x in evals[:i])]
    kill_at = after[0] + 1

    killed = tmp_path / "killed"
    proc = _recipe(killed, *args)
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        metrics = killed / "metrics.jsonl"
        if metrics.is_file() and f'"step": {kill_at},' in metrics.read_text():
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = json.loads((killed / "checkpoints" / f"step_{after[0]}" / "train_state.json").read_text())
    assert state["evals_since_best"] == 1
    resumed = _recipe(killed, *args, "checkpoint.resume=latest")
    out, err = resumed.communicate()
    assert resumed.returncode == 0, err[-2000:]
    got = json.loads((killed / "summary.json").read_text())
    assert got["early_stopping"] == early and got["steps"] == ref["steps"] and got["exported"] == ref["exported"]
    a, b = load_file(killed / "model" / "model.safetensors"), load_file(tmp_path / "ref" / "model" / "model.safetensors")
    assert all(a[k].equal(b[k]) for k in b)

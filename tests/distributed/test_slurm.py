"""scripts/slurm/finetune.sbatch under stand-in `srun`/`scontrol` (tests/distributed/slurm_standin/) that
behave as SLURM documents: SIGUSR1 to the batch shell (what `--signal=B:USR1@120` sends) reaches the ranks,
the run checkpoints and says so, the job requeues itself, and the requeued job resumes to the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, TINY

STANDIN = Path(__file__).parent / "slurm_standin"
ARGS = [*TINY, "trainer.log_every=2", "trainer.max_steps=60", "task.max_train_samples=400",
        "trainer.batch_size=4", "logging.project=my project"]  # a value with a space stays one argument


def _job(tmp_path, job_id: str) -> subprocess.Popen:
    env = {**os.environ, "PATH": f"{STANDIN}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "SLURM_JOB_ID": job_id, "SLURM_SUBMIT_DIR": str(ROOT), "SLURM_JOB_NODELIST": "127.0.0.1",
           "SLURM_NNODES": "1", "SLURM_GPUS_PER_NODE": "2", "RUN_DIR": str(tmp_path / "run"),
           "SCONTROL_LOG": str(tmp_path / "scontrol.log"), "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "600"}
    log = (tmp_path / f"job-{job_id}.log").open("a")
    return subprocess.Popen(["bash", "scripts/slurm/finetune.sbatch", *ARGS], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def _logged_step(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return 0
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines() if '"train"' in x]
    return max(steps, default=0)


@pytest.mark.distributed
def test_sigusr1_before_the_time_limit_checkpoints_requeues_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    job = _job(tmp_path, "4242")
    deadline = time.monotonic() + 3600
    while _logged_step(run_dir) < 6:
        assert job.poll() is None and time.monotonic() < deadline, (tmp_path / "job-4242.log").read_text()[-3000:]
        time.sleep(0.05)
    job.send_signal(signal.SIGUSR1)  # SLURM signals the batch shell only (B:)
    assert job.wait() == 0, (tmp_path / "job-4242.log").read_text()[-3000:]
    log = (tmp_path / "job-4242.log").read_text()
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n", log[-3000:]
    assert (run_dir / "PREEMPTED").is_file() and not (run_dir / "summary.json").exists()
    saved = sorted(run_dir.glob("checkpoints/step_*"))
    assert len(saved) == 1, log[-3000:]
    stopped_at = int(saved[0].name.split("_")[1])
    assert 6 <= stopped_at < 60

    requeued = _job(tmp_path, "4242")  # SLURM starts the same job again
    assert requeued.wait() == 0, (tmp_path / "job-4242.log").read_text()[-3000:]
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"  # finished: no second requeue
    assert not (run_dir / "PREEMPTED").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["steps"], summary["num_processes"]) == (60, 2)
    assert "checkpoint.resume=latest" in (tmp_path / "job-4242.log").read_text()
    import yaml

    assert yaml.safe_load((run_dir / "config.yaml").read_text())["logging"]["project"] == "my project"


@pytest.mark.distributed
@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "python").is_file(), reason="no .venv: make setup makes it")
def test_the_script_runs_the_projects_venv_without_it_activated(tmp_path):
    """`make setup`, then the script as the README shows it, no venv activated: the job runs .venv's python (as
    make does), not whatever `python` the nodes' PATH has (none here)."""
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": f"{STANDIN}:/usr/bin:/bin", "SLURM_JOB_ID": "7",
           "SLURM_SUBMIT_DIR": str(ROOT), "SLURM_JOB_NODELIST": "127.0.0.1", "SLURM_NNODES": "1",
           "SLURM_GPUS_PER_NODE": "2", "RUN_DIR": str(tmp_path / "run"), "SCONTROL_LOG": str(tmp_path / "scontrol.log")}
    env.update({k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "HF_", "AMPFT", "OMP_"))})
    proc = subprocess.run(["bash", "scripts/slurm/finetune.sbatch", *TINY, "trainer.max_steps=2",
                           "task.max_train_samples=64"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["num_processes"] == 2

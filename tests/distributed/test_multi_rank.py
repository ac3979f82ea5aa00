"""Distributed launches on CPU, every backend with two real ranks (`make test-distributed`): DDP, DeepSpeed
ZeRO-1/2/3 and FSDP2 each against one process with the same global batch (losses, learning rates, evaluation,
shards per rank, the consolidated export, resume after SIGKILL), DeepSpeed bf16 against one-process bf16; and
the generated launcher and DeepSpeed configs checked against the precision group."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ampft.distributed import deepspeed_config
from tests.helpers import CONF, ROOT, TINY, assert_export_reproduces

NO_DROPOUT = ["+model.arch.hidden_dropout_prob=0.0", "+model.arch.attention_probs_dropout_prob=0.0"]
DEEPSPEED = sorted(p.stem for p in (CONF / "distributed").glob("deepspeed-*.yaml"))


def _make(*args: str, timeout: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "finetune", *args, f"PYTHON={sys.executable}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _train_losses(run_dir) -> dict[int, float]:
    events = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {e["step"]: e["loss"] for e in events if e["event"] == "train"}


@pytest.mark.parametrize("dist", DEEPSPEED)
@pytest.mark.parametrize("prec", ["fp32", "fp16", "bf16"])
def test_deepspeed_precision_section_comes_from_the_precision_group(compose, dist, prec):
    cfg = compose([f"distributed={dist}", f"precision={prec}", "trainer.batch_size=12", "trainer.grad_accum=3"])
    ds, _ = deepspeed_config(cfg)
    assert ds["fp16"]["enabled"] == (prec == "fp16") and ds["bf16"]["enabled"] is False  # bf16: autocast
    assert ds.get("torch_autocast", {}).get("dtype") == ("bfloat16" if prec == "bf16" else None)
    if prec == "fp16":
        assert ds["fp16"]["initial_scale_power"] == 16 and ds["fp16"]["loss_scale_window"] == 2000
    zero = ds["zero_optimization"]
    assert zero["stage"] == cfg.distributed.zero_stage == int(dist.split("-z")[1][0])
    assert ("offload_optimizer" in zero) == dist.endswith("offload")
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (12, 3)
    if zero["stage"] == 3:
        assert zero["stage3_gather_16bit_weights_on_model_save"] is True


def test_launcher_configs_carry_no_precision_and_exist(compose):
    for path in (CONF / "accelerate").glob("*.yaml"):
        text = path.read_text()
        assert "mixed_precision" not in text and "deepspeed_config_file" not in text, path.name
        yaml.safe_load(text)
    for path in (CONF / "distributed").glob("*.yaml"):
        d = compose([f"distributed={path.stem}"]).distributed
        if d.accelerate_config:
            assert (CONF / "accelerate" / d.accelerate_config).is_file(), path.name


def test_dry_run_prints_the_command_for_every_machine():
    proc = _make("distributed=multinode", "nproc=4", "distributed.main_process_ip=10.1.2.3",
                 "hydra.run.dir=/shared/runs/j1", "precision=bf16", "dry_run=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "# machine 0" in out and "# machine 1" in out
    lines = [x for x in out.splitlines() if "-m ampft.launch --accelerate" in x]  # accelerate launch, ranks' code
    assert len(lines) == 2
    for rank, line in enumerate(lines):
        assert f"--machine_rank {rank}" in line and "--num_processes 8" in line and "--num_machines 2" in line
        assert "--main_process_ip 10.1.2.3" in line and "hydra.run.dir=/shared/runs/j1" in line
        assert "precision=bf16" in line and "recipes/finetune.py" in line


def test_several_machines_need_a_shared_run_dir(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    proc = _make("distributed=multinode", "distributed.main_process_ip=10.1.2.3", "dry_run=1")
    assert proc.returncode != 0 and "hydra.run.dir" in proc.stderr



# Two ranks x batch 4 against one process x batch 8: the same examples per step, the same learning rates.
STEPS, KILL_AT = 24, 12
EXACT = [*TINY, *NO_DROPOUT, "trainer.log_every=1", f"trainer.max_steps={STEPS}", "checkpoint.every=8",
         "checkpoint.keep_last=10"]
# fp32 with dropout off: the ranks' gradients are averaged in another order than one process sums them.
LOSS_TOL = 2e-5
BACKENDS = {"ddp": "MULTI_CPU", "deepspeed-z1": "DEEPSPEED", "deepspeed-z2": "DEEPSPEED",
            "deepspeed-z3": "DEEPSPEED", "fsdp": "FSDP"}


@pytest.fixture(scope="module", autouse=True)
def _torch_extensions(tmp_path_factory):
    """DeepSpeed JIT-builds its CPU communication op once for this module's launches (a fresh folder: no stale
    lock), instead of once per run as it would in each run's own folder (the default)."""
    old = os.environ.get("TORCH_EXTENSIONS_DIR")
    os.environ["TORCH_EXTENSIONS_DIR"] = str(tmp_path_factory.mktemp("torch_extensions"))
    yield
    if old is None:
        del os.environ["TORCH_EXTENSIONS_DIR"]
    else:
        os.environ["TORCH_EXTENSIONS_DIR"] = old


def _events(run_dir, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def _popen(run_dir, *args: str, name: str | None = None) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    # a file, not a pipe that could fill and block
    log = (run_dir.parent / f"{name or run_dir.name}.log").open("a")
    return subprocess.Popen(["make", "--no-print-directory", "finetune", *args, f"hydra.run.dir={run_dir}",
                             f"PYTHON={sys.executable}"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)


def _log(run_dir, name: str | None = None) -> str:
    return (run_dir.parent / f"{name or run_dir.name}.log").read_text()[-4000:]


def _sigkill_at(proc: subprocess.Popen, run_dir, step: int) -> None:
    """SIGKILL the launcher and every rank (torch's launcher starts each rank in its own session) once `step`
    is logged: what an OOM killer or a lost node does, no handler runs."""
    import psutil

    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"run ended before step {step}:\n{_log(run_dir)}"
        metrics = run_dir / "metrics.jsonl"
        if metrics.is_file() and f'"step": {step},' in metrics.read_text():
            break
        time.sleep(0.01)
    descendants = psutil.Process(proc.pid).children(recursive=True)
    for p in [*descendants, psutil.Process(proc.pid)]:
        p.send_signal(signal.SIGKILL)
    psutil.wait_procs(descendants)
    proc.wait()  # (make itself is reaped here, so that its return code is the signal)


def _numel(obj) -> int:
    import torch

    if torch.is_tensor(obj):
        return obj.numel()
    if isinstance(obj, dict):
        return sum(_numel(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_numel(v) for v in obj)
    return 0


def _consolidated(backend: str, ckpt) -> dict:
    """The full fp32 weights of a checkpoint, gathered from its shards by the backend's own tool."""
    import torch
    from safetensors.torch import load_file

    if backend.startswith("deepspeed"):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag="pytorch_model")
    if backend == "fsdp":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        dcp_to_torch_save(ckpt / "pytorch_model_fsdp_0", ckpt.parent / "consolidated.pt")
        state = torch.load(ckpt.parent / "consolidated.pt", weights_only=False)
        return state.get("model", state)
    return load_file(ckpt / "model.safetensors")


def _shares(backend: str, ckpt, n_params: int) -> dict[str, list[int]]:
    """Elements of optimizer state and of weights that each rank wrote (one list entry per rank)."""
    import torch

    if backend.startswith("deepspeed"):
        out: dict[str, list[int]] = {"master weights": [], "adam moments": [], "16-bit weights": []}
        for rank in (0, 1):
            files = ckpt / "pytorch_model"
            optim = torch.load(files / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", weights_only=False)
            opt = optim["optimizer_state_dict"]
            out["master weights"].append(_numel(opt.get("single_partition_of_fp32_groups",
                                                        opt.get("fp32_flat_groups"))))
            out["adam moments"].append(_numel(opt.get("base_optimizer_state", opt.get("optimizer_state_dict"))))
            model_file = files / (f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt" if "z3" in backend
                                  else "mp_rank_00_model_states.pt")
            out["16-bit weights"].append(_numel(torch.load(model_file, weights_only=False)["module"]))
        return out
    if backend == "fsdp":  # bytes of each rank's DCP file / 4 (fp32)
        return {what: [(ckpt / folder / f"__{r}_0.distcp").stat().st_size // 4 for r in (0, 1)]
                for what, folder in (("weights", "pytorch_model_fsdp_0"), ("adam moments", "optimizer_0"))}
    opt = torch.load(ckpt / "optimizer.bin", weights_only=False)  # DDP: one full replica, written by rank 0
    return {"adam moments": [_numel(opt["state"])] * 2, "weights": [n_params] * 2}


def _check_export_and_shares(backend: str, run_dir, one_process) -> None:
    from safetensors.torch import load_file

    # The export: one Hugging Face folder, equal to the checkpoint's weights gathered by the backend's own
    # tool, and to one process's weights up to the same summation-order noise.
    exported = load_file(run_dir / "model" / "model.safetensors")
    ckpt = run_dir / "checkpoints" / f"step_{STEPS}"
    full = _consolidated(backend, ckpt)
    assert set(full) == set(exported)
    for name, tensor in full.items():
        assert exported[name].equal(tensor.to(exported[name].dtype)), name
    reference = load_file(one_process / "model" / "model.safetensors")
    assert max((exported[k] - reference[k]).abs().max().item() for k in reference) < 1e-4

    # Each rank's share: under ZeRO and FSDP half of the optimizer state (and, for ZeRO-3 and FSDP, half of
    # the weights); under DDP and ZeRO-1/2 full weights on every rank.
    n = sum(t.numel() for t in exported.values())
    shares = _shares(backend, ckpt, n)
    print(backend, "parameters", n, "per-rank elements", shares)  # the numbers in docs/distributed.md
    want = {"adam moments": n, "master weights": n / 2, "weights": n / 2,  # sharded in two
            "16-bit weights": 0 if "z3" in backend else n}  # ZeRO's model file: the full module unless stage 3
    if backend == "ddp":  # a full replica on every rank
        want = {"adam moments": 2 * n, "weights": n}
    slack = 0.05 if backend == "fsdp" else 0.02  # FSDP: file bytes / 4, with DCP's per-tensor headers;
    for what, per_rank in shares.items():  # ZeRO: element counts, with Adam's step counters and alignment padding
        assert all(abs(x - want[what]) <= slack * n for x in per_rank), (what, per_rank, want[what])


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("one") / "run"
    proc = _popen(run_dir, *EXACT, "trainer.batch_size=8")
    assert proc.wait() == 0, _log(run_dir)
    return run_dir


@pytest.mark.distributed
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_two_cpu_ranks_equal_one_process_through_sigkill_and_resume(tmp_path, one_process, backend):
    """One launch killed by SIGKILL after its step-8 checkpoint, one resumed launch: every logged loss and
    learning rate equals one process's with the same global batch; evaluation, shards, export checked too."""
    run_dir = tmp_path / "run"
    args = [*EXACT, f"distributed={backend}", "nproc=2", "trainer.batch_size=4"]
    killed = _popen(run_dir, *args)
    _sigkill_at(killed, run_dir, KILL_AT)
    assert killed.returncode == -signal.SIGKILL
    assert not (run_dir / "summary.json").exists()
    resumed = _popen(run_dir, *args, "checkpoint.resume=latest")
    assert resumed.wait() == 0, _log(run_dir)

    ref = {e["step"]: e for e in _events(one_process, "train")}
    got = _events(run_dir, "train")
    assert [e["step"] for e in got] == sorted(ref) == list(range(1, STEPS + 1))  # one clean history
    # The steps after the step-8 checkpoint that the killed launch logged were moved aside on resume.
    replaced = [json.loads(line) for line in (run_dir / "metrics.replaced.jsonl").read_text().splitlines()]
    replaced = [e for e in replaced if e["event"] == "train"]
    moved = {e["step"] for e in replaced}
    assert set(range(9, KILL_AT + 1)) <= moved and min(moved) == 9  # (the kill may land a step or two late)
    for e in got + replaced:  # the killed launch's losses and the resumed one's: both the one process's
        assert e["loss"] == pytest.approx(ref[e["step"]]["loss"], abs=LOSS_TOL), e["step"]
        assert e["lr"] == pytest.approx(ref[e["step"]]["lr"], rel=1e-9), e["step"]

    s1 = json.loads((one_process / "summary.json").read_text())
    s2 = json.loads((run_dir / "summary.json").read_text())
    assert (s2["num_processes"], s2["distributed_type"], s2["steps"]) == (2, BACKENDS[backend], STEPS)
    assert s2["eval_samples"] == s1["eval_samples"] == 101  # each example once, whatever the backend
    for metric in ("accuracy", "f1"):  # (the loss is issue 16's)
        assert s2["eval"][metric] == s1["eval"][metric], metric
    assert len(_events(run_dir, "eval")) == 1  # only rank 0 writes

    _check_export_and_shares(backend, run_dir, one_process)
    assert_export_reproduces(run_dir)  # reloaded in one process, the export scores the run's final evaluation


@pytest.mark.distributed
def test_zero3_trains_on_after_an_evaluation(tmp_path, one_process):
    """ZeRO-3 gathers its partitioned weights for each evaluation: training goes on after one (trainer.eval_every,
    an epoch's end, a checkpoint's keep_best) with the losses of one process, which evaluated only at the end."""
    run_dir = tmp_path / "run"
    proc = _popen(run_dir, *EXACT, "distributed=deepspeed-z3", "nproc=2", "trainer.batch_size=4",
                  "trainer.eval_every=8", "checkpoint.every=0")
    assert proc.wait() == 0, _log(run_dir)
    assert [e["step"] for e in _events(run_dir, "eval")] == [8, 16, 24]
    ref = {e["step"]: e["loss"] for e in _events(one_process, "train")}
    got = {e["step"]: e["loss"] for e in _events(run_dir, "train")}
    assert sorted(got) == list(range(1, STEPS + 1))
    for step, loss in got.items():
        assert loss == pytest.approx(ref[step], abs=LOSS_TOL), step


@pytest.mark.distributed
@pytest.mark.parametrize("backend", ["ddp", "deepspeed-z3", "fsdp"])
def test_gradient_checkpointing_on_two_ranks_trains_as_one_process_without_it(tmp_path, one_process, backend):
    """model.gradient_checkpointing=true, the one switch: under DDP, ZeRO-3 (its partitioned weights gathered again
    for the recomputed forward) and FSDP2 (its own activation checkpointing off) each logged loss is one process's
    without checkpointing, and the export reloads to the run's evaluation."""
    run_dir = tmp_path / "run"
    proc = _popen(run_dir, *EXACT, f"distributed={backend}", "nproc=2", "trainer.batch_size=4",
                  "model.gradient_checkpointing=true")
    assert proc.wait() == 0, _log(run_dir)
    ref = {e["step"]: e["loss"] for e in _events(one_process, "train")}
    got = {e["step"]: e["loss"] for e in _events(run_dir, "train")}
    assert sorted(got) == sorted(ref)
    for step, loss in got.items():
        assert loss == pytest.approx(ref[step], abs=LOSS_TOL), step
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["gradient_checkpointing"] and summary["num_processes"] == 2
    assert_export_reproduces(run_dir)


@pytest.mark.distributed
def test_resuming_on_another_number_of_processes_is_refused_unless_allowed(tmp_path, one_process):
    """One process's step-8 checkpoint resumed on two ranks: refused (the world size is recorded in the
    checkpoint), naming the change; allowed, with the same global batch (2 x 4), it goes on as one process
    did, loss for loss."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(one_process, run_dir)
    step_8 = run_dir / "checkpoints" / "step_8"
    args = [*EXACT, "distributed=ddp", "nproc=2", "trainer.batch_size=4", f"checkpoint.resume={step_8}"]
    refused = _make(*args, f"hydra.run.dir={run_dir}")
    assert refused.returncode != 0
    assert "processes (world size): 1 -> 2, so the global batch: 8 -> 8 examples per update" in refused.stderr
    assert "trainer.batch_size: 8 -> 4" in refused.stderr
    proc = _popen(run_dir, *args, "checkpoint.allow_config_change=true", "checkpoint.export=false")
    assert proc.wait() == 0, _log(run_dir)
    ref = {e["step"]: e for e in _events(one_process, "train")}
    got = _events(run_dir, "train")
    assert [e["step"] for e in got] == list(range(1, STEPS + 1))
    for e in got[8:]:
        assert e["loss"] == pytest.approx(ref[e["step"]]["loss"], abs=LOSS_TOL), e["step"]
        assert e["epoch"] == pytest.approx(ref[e["step"]]["epoch"]), e["step"]


@pytest.mark.distributed
@pytest.mark.parametrize("backend", ["deepspeed-z2-offload", "deepspeed-z3-offload"])
def test_offloaded_zero_equals_one_process(tmp_path, one_process, backend):
    """ZeRO-2/3 with the optimizer (and under ZeRO-3 the weights) in CPU memory: Accelerate swaps the AdamW for
    DeepSpeedCPUAdam (a C++ op JIT-built once per module into its own folder), and two ranks still train as
    one process with the same global batch. Resume is the same code path as without offload (tested above)."""
    run_dir = tmp_path / "run"
    proc = _popen(run_dir, *EXACT, f"distributed={backend}", "nproc=2", "trainer.batch_size=4")
    assert proc.wait() == 0, _log(run_dir)
    assert (Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "cpu_adam" / "cpu_adam.so").is_file()  # the CPU Adam ran
    ref = {e["step"]: e for e in _events(one_process, "train")}
    got = _events(run_dir, "train")
    assert [e["step"] for e in got] == list(range(1, STEPS + 1))
    for e in got:
        assert e["loss"] == pytest.approx(ref[e["step"]]["loss"], abs=LOSS_TOL), e["step"]
        assert e["lr"] == pytest.approx(ref[e["step"]]["lr"], rel=1e-9), e["step"]
    s1 = json.loads((one_process / "summary.json").read_text())
    s2 = json.loads((run_dir / "summary.json").read_text())
    assert (s2["num_processes"], s2["distributed_type"]) == (2, "DEEPSPEED")
    assert s2["eval"]["accuracy"] == s1["eval"]["accuracy"]
    _check_export_and_shares(backend.removesuffix("-offload"), run_dir, one_process)


@pytest.mark.distributed
def test_deepspeed_bf16_runs_autocast_like_every_other_backend(tmp_path):
    """precision=bf16 under DeepSpeed is autocast with fp32 weights and gradients (DeepSpeed's torch_autocast),
    as on one process: the losses agree to bf16 noise, and summary.json says how DeepSpeed ran it."""
    common = [*TINY, *NO_DROPOUT, "precision=bf16", "trainer.log_every=1", "trainer.max_steps=8"]
    one = _popen(tmp_path / "one", *common, "trainer.batch_size=8")
    assert one.wait() == 0, _log(tmp_path / "one")
    ds = _popen(tmp_path / "z2", *common, "distributed=deepspeed-z2", "nproc=2", "trainer.batch_size=4")
    assert ds.wait() == 0, _log(tmp_path / "z2")
    s = json.loads((tmp_path / "z2" / "summary.json").read_text())
    assert (s["precision"], s["deepspeed_precision"], s["distributed_type"]) == ("bf16", "autocast", "DEEPSPEED")
    ref = {e["step"]: e["loss"] for e in _events(tmp_path / "one", "train")}
    for e in _events(tmp_path / "z2", "train"):
        assert e["loss"] == pytest.approx(ref[e["step"]], abs=1e-2), e["step"]
    # fp32 weights: the export is fp32, as after a one-process bf16 run
    config = json.loads((tmp_path / "z2" / "model" / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "float32"
    assert_export_reproduces(tmp_path / "z2")


@pytest.mark.distributed
def test_fsdp_fp16_an_overflow_on_one_rank_is_skipped_by_every_rank(tmp_path):
    """FSDP2 with fp16 on 2 CPU ranks: each rank checks only its own gradient shard for inf, so an overflow in
    one shard must make every rank skip the step (torch's DTensor all-reduces the scaler's found-inf flag) or
    the shards drift apart. Rank 1 alone gets an inf at the 3rd step; rank 0, the one that logs, skips it too."""
    from ampft import launch
    from ampft.validation import validate

    run_dir = tmp_path / "run"
    overrides = [*TINY, *NO_DROPOUT, "precision=fp16", "distributed=fsdp", "distributed.num_processes=2",
                 "trainer.batch_size=4", "trainer.log_every=1", "trainer.max_steps=6", f"hydra.run.dir={run_dir}"]
    cfg = launch.compose(overrides)
    validate(cfg)
    (cmd,), env = launch.commands(cfg, overrides)
    cmd[cmd.index(launch.RECIPE):cmd.index(launch.RECIPE) + 1] = ["tests/distributed/overflow_on_one_rank.py",
                                                                   "1:3"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert (s["precision"], s["distributed_type"], s["num_processes"]) == ("fp16", "FSDP", 2)
    assert s["skipped_steps"] == 1 and s["steps"] == 6  # a skipped step is not an optimizer step
    train = _events(run_dir, "train")
    assert [e["step"] for e in train] == list(range(1, 7))
    scales = [e["loss_scale"] for e in train]
    assert scales[:2] == [2.0**16] * 2 and scales[2:] == [2.0**15] * 4, scales  # backed off once, on rank 0
    assert all(map(math.isfinite, (e["loss"] for e in train)))


@pytest.mark.distributed
def test_two_machines_on_localhost_train_as_one_world_in_one_run_dir(tmp_path, one_process):
    """distributed=multinode as two "machines" (one process each) on 127.0.0.1, one shared run directory:
    one world of 2 whose losses equal one process with the same global batch."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "shared"
    common = [*EXACT, "distributed=multinode", "nproc=1", "trainer.batch_size=4", "distributed.main_process_ip=127.0.0.1",
              f"distributed.main_process_port={port}"]
    machines = [_popen(run_dir, *common, f"distributed.machine_rank={rank}", name=f"machine{rank}")
                for rank in (0, 1)]
    for rank, proc in enumerate(machines):
        assert proc.wait() == 0, _log(run_dir, f"machine{rank}")
    s = json.loads((run_dir / "summary.json").read_text())
    assert (s["num_processes"], s["distributed_type"], s["steps"]) == (2, "MULTI_CPU", STEPS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["machine0.log", "machine1.log", "shared"]
    ref = {e["step"]: e["loss"] for e in _events(one_process, "train")}
    got = _events(run_dir, "train")
    assert [e["step"] for e in got] == list(range(1, STEPS + 1))  # one writer
    for e in got:
        assert e["loss"] == pytest.approx(ref[e["step"]], abs=LOSS_TOL), e["step"]
    assert sorted(p.name for p in (run_dir / "checkpoints" / "step_8").glob("random_states_*")) == [
        "random_states_0.pkl", "random_states_1.pkl"]  # both machines' ranks saved into the shared folder


@pytest.mark.distributed
def test_a_hand_typed_accelerate_launch_takes_its_world_from_the_launcher(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2 recipes/finetune.py ...` with no `distributed=` and no
    ACCELERATE_USE_CPU on a machine without GPUs: two gloo ranks, not two lone copies or a traceback. (Without
    `--multi_gpu` or a config file, Accelerate 1.15 starts one process on a machine without GPUs.)"""
    env = {k: v for k, v in os.environ.items() if k not in ("ACCELERATE_USE_CPU", "ACCELERATE_USE_DEEPSPEED")}
    proc = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
         "recipes/finetune.py", *TINY,
         "trainer.max_steps=4", "trainer.log_every=2", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert (s["num_processes"], s["steps"], s["train_samples"]) == (2, 4, 4 * 16 * 2)
    assert "Setting accelerator to CPU" not in proc.stdout + proc.stderr  # DeepSpeed installed, not used: silent
    # With the default logging (TensorBoard) on, the run still exports and summarises after training.
    assert list((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
    assert_export_reproduces(tmp_path)
    if not torch_cuda():
        assert s["distributed_type"] == "MULTI_CPU"


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()

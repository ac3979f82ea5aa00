"""`make finetune` goes through here (`python -m ampft.launch [--dry-run] [hydra overrides ...]`): compose and
validate once, decide the run dir once (created atomically), then the recipe or `accelerate launch` per machine,
handed the composed config in `$AMPFT_LAUNCHED` (docs/architecture.md, `launch`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from ampft.config import run_stamp, to_plain
from ampft.errors import ConfigError, check_overrides, compose_problem, exit_on_error

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "recipes/finetune.py"
ACCELERATE = "--accelerate"  # `python -m ampft.launch --accelerate ARGS`: `accelerate launch ARGS` keeping the ranks' code
HANDOFF = "AMPFT_LAUNCHED"  # the composed config, from the launcher to the recipe and its ranks (`handoff`)


def compose(overrides: list[str], with_hydra: bool = False) -> DictConfig:
    """The recipe's config as `recipes/finetune.py` composes it (`with_hydra`: with Hydra's part); what Hydra
    cannot compose, or composes while nothing reads it, is a ConfigError."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3", job_name=Path(RECIPE).stem):
        try:
            cfg = hydra_compose(config_name="finetune", overrides=overrides, return_hydra_config=with_hydra)
        except Exception as exc:
            if (problem := compose_problem(exc)) is None:
                raise
            raise ConfigError([problem]) from None
        check_overrides(cfg, overrides)
        return cfg


def run_dir_base(cfg: DictConfig) -> str:
    """The folder new run dirs go into: conf/finetune.yaml's hydra.run.dir (the one place the pattern is
    written) without its `${ampft_stamp:}`, resolved against this run's config."""
    pattern = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "finetune.yaml"))["hydra"]["run"]["dir"]
    base, stamp = pattern.rsplit("/", 1)
    assert stamp == "${ampft_stamp:}", f"conf/finetune.yaml: hydra.run.dir={pattern} must end in /${{ampft_stamp:}}"
    return OmegaConf.create({**to_plain(cfg), "_run_dir_base": base})["_run_dir_base"]


def _run_dir(cfg: DictConfig, overrides: list[str], create: bool = True) -> str | None:
    """hydra.run.dir if given; else a new folder `<time>_<random>` under runs/<task>/<model>-<precision>,
    created here (exist_ok=False: taken by no other run); None for several machines outside SLURM."""
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")]
    if given:
        if create:
            _mkdir(given[-1], exist_ok=True)
        return given[-1]
    base = run_dir_base(cfg)
    if cfg.distributed.num_machines > 1:
        job = os.environ.get("SLURM_JOB_ID")
        return f"{base}/job-{job}" if job else None
    if not create:
        return f"{base}/{run_stamp()}"
    drawn = set()
    while (path := f"{base}/{run_stamp()}") not in drawn:  # run_stamp is fixed inside a rank ($LOCAL_RANK)
        drawn.add(path)
        with contextlib.suppress(FileExistsError):  # another run took this name in the same second: draw again
            _mkdir(path, exist_ok=False)
            return path
    raise ConfigError([f"run dir {path} exists and no other name can be drawn here: pass hydra.run.dir="])


def _mkdir(path: str, exist_ok: bool) -> None:
    """Make a run dir (and its parents), or a ConfigError saying why it cannot be made; FileExistsError passes
    when not `exist_ok` (the caller draws another name)."""
    try:
        Path(path).mkdir(parents=True, exist_ok=exist_ok)
    except OSError as exc:
        if isinstance(exc, FileExistsError) and not exist_ok:
            raise
        raise ConfigError([f"hydra.run.dir={path}: the run dir cannot be made there ({exc.strerror or exc}); give "
                           "a folder you can write to"]) from exc


def commands(cfg: DictConfig, overrides: list[str], create: bool = True) -> tuple[list[list[str]], dict[str, str]]:
    """(one command per machine, extra environment). A single process: the recipe itself. `create`: make
    the new run dir (False for --dry-run)."""
    import torch

    from ampft.config import Backend

    d = cfg.distributed
    run_dir = _run_dir(cfg, overrides, create)
    if run_dir is None:
        raise ConfigError(["several machines need one shared run directory: pass hydra.run.dir=/shared/path "
                           "(or run under SLURM, where $SLURM_JOB_ID names it)"])
    recipe = [RECIPE, *[o for o in overrides if not o.startswith("hydra.run.dir=")], f"hydra.run.dir={run_dir}"]
    if d.backend == Backend.single and d.num_processes == 1 and d.num_machines == 1:
        return [[sys.executable, *recipe]], {}
    # MULTI_CPU ranks over gloo (`--cpu` alone starts one process); FSDP2 then runs on them
    # (ampft.distributed.fsdp_on_cpu). DeepSpeed needs no flag: it gets gloo from ampft.
    on_cpu = not torch.cuda.is_available() and d.backend in (Backend.ddp, Backend.fsdp)
    env = {"ACCELERATE_USE_CPU": "true"} if on_cpu else {}
    cmds = []
    for rank in range(d.num_machines):
        cmd = [sys.executable, "-m", "ampft.launch", ACCELERATE,
               "--config_file", str(Path("conf/accelerate") / (d.accelerate_config or "ddp.yaml")),
               "--num_processes", str(d.num_processes * d.num_machines),
               "--num_machines", str(d.num_machines), "--machine_rank", str(rank)]
        if d.num_machines > 1:
            cmd += ["--main_process_ip", str(d.main_process_ip), "--main_process_port", str(d.main_process_port)]
        cmds.append(cmd + recipe)
    return cmds, env


def accelerate_launch(argv: list[str]) -> None:
    """`accelerate launch ARGV` in this process, ending with the ranks' code: `accelerate launch` turns failed
    ranks into exit code 1; here the earliest rank with one of ampft's codes (2, 3, 75) gives it, one line lists
    every rank's. A launcher stopped by a signal exits 75 when its ranks wrote the PREEMPTED marker meanwhile,
    else as accelerate does (128 + it)."""
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from ampft.errors import AmpftError, Preempted, TrainingDiverged

    started = time.time()
    ours = {AmpftError.exit_code, TrainingDiverged.exit_code, Preempted.exit_code}
    # torch's launcher passes on TERM/INT/HUP/QUIT only; SIGUSR1 (a preemption, as SIGTERM) would kill it alone and
    # leave the ranks training on, orphaned
    os.environ.setdefault("PET_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1")
    try:
        launch_command(launch_command_parser().parse_args(argv))
        return
    except ChildFailedError as exc:
        failures = sorted(exc.failures.items(), key=lambda kv: kv[1].timestamp)
        print("ranks ended with: " + ", ".join(f"rank {r}: {f.exitcode}" for r, f in failures)
              + " (negative: killed by that signal)", file=sys.stderr, flush=True)
        code = next((f.exitcode for _, f in failures if f.exitcode in ours), 1)
    except SystemExit as exc:  # accelerate's own ends: a signal to the launcher, 128 + its number
        code = exc.code if isinstance(exc.code, int) else 1
    dirs = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")]
    marker = Path(dirs[-1]) / Preempted.marker if dirs else None
    if code not in (0, Preempted.exit_code) and marker is not None and marker.is_file() \
            and marker.stat().st_mtime >= started:
        code = Preempted.exit_code
    sys.exit(code)


def main(argv: list[str]) -> None:
    if argv[:1] == [ACCELERATE]:
        return accelerate_launch(argv[1:])
    dry_run = "--dry-run" in argv
    overrides = [a for a in argv if a != "--dry-run"]
    if any(a.startswith("-") for a in overrides):  # Hydra flags (-m, --cfg, ...): the recipe handles them
        # Overrides first, the flags (with their values) after them: Hydra's parser takes its overrides in one
        # run, so `a=1 -m b=2` (make finetune a=1 ARGS="-m b=2") would leave b=2 unrecognized.
        first = [a for a in overrides if not a.startswith("-") and ("=" in a or a.startswith("~"))]
        os.execv(sys.executable, [sys.executable, RECIPE, *first, *[a for a in overrides if a not in first]])
    from ampft.validation import validate

    composed = compose(overrides, with_hydra=True)
    cfg = without_hydra(composed)
    for warning in validate(cfg):
        print(f"warning: {warning}", file=sys.stderr)
    if cfg.checkpoint.resume == "latest" and not any(o.startswith("hydra.run.dir=") for o in overrides):
        print("warning: checkpoint.resume=latest without hydra.run.dir: this run gets a new run dir, so it starts "
              "afresh; to resume a run, pass hydra.run.dir=<its run dir>", file=sys.stderr)
    cmds, env = commands(cfg, overrides, create=not dry_run)
    prefix = "".join(f"{k}={v} " for k, v in env.items())
    if dry_run:
        for rank, cmd in enumerate(cmds):
            where = f"machine {rank}" if len(cmds) > 1 else "command"
            print(f"# {where}\n{prefix}{shlex.join(cmd)}")
        return
    cmd = cmds[cfg.distributed.machine_rank]
    print(f"+ {prefix}{shlex.join(cmd)}", file=sys.stderr, flush=True)
    env[HANDOFF] = handoff(composed, cmd[cmd.index(RECIPE) + 1:])
    os.execve(sys.executable, cmd, {**os.environ, **env})


def without_hydra(composed: DictConfig) -> DictConfig:
    """The job's config: what the recipe's task function gets (Hydra's own part removed)."""
    cfg = copy.deepcopy(composed)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def handoff(composed: DictConfig, argv: list[str]) -> str:
    """`composed` (with its Hydra part) as the recipe run with `argv` would compose it, and `argv`, as YAML for
    `$AMPFT_LAUNCHED`; the run dir (`argv`'s last argument) is recorded last of the Hydra overrides, as Hydra
    would."""
    run_dir = argv[-1].removeprefix("hydra.run.dir=")
    composed = copy.deepcopy(composed)
    h = composed.hydra
    with open_dict(h):
        h.run.dir = run_dir
        h.overrides.hydra = [o for o in h.overrides.hydra if not o.startswith("hydra.run.dir=")] + [argv[-1]]
    return OmegaConf.to_yaml(OmegaConf.create({"argv": argv, "config": composed}))


def run_launched(task: Callable[[DictConfig], Any]) -> bool:
    """In the recipe: run `task` on the launcher's config (`$AMPFT_LAUNCHED`) when this process has the
    arguments it was handed for, else return False. Hydra's `run_job` runs it as its run mode would (run dir,
    `.hydra/`, logging, callbacks); an exception of the job other than ampft's is raised here."""
    text = os.environ.pop(HANDOFF, None)  # taken: the processes this one starts do not see it
    if text is None:
        return False
    handed = OmegaConf.create(text)
    if list(handed.argv) != sys.argv[1:]:  # a recipe started otherwise inside a launched run: it composes itself
        return False
    from hydra._internal.callbacks import Callbacks  # what Hydra's run mode calls around a job
    from hydra.conf import HydraConf
    from hydra.core.utils import JobRuntime, run_job
    from hydra.types import HydraContext, RunMode

    from ampft.config import FinetuneConfig

    plain = OmegaConf.to_container(handed.config, resolve=False)  # typed again, as composed: enums, the schema
    hydra_part = OmegaConf.structured(HydraConf)
    with open_dict(hydra_part):  # Hydra's composed part: its schema, `env` added, `defaults` consumed
        hydra_part.merge_with(plain.pop("hydra"))
        del hydra_part["defaults"]
    cfg = OmegaConf.merge(OmegaConf.structured(FinetuneConfig), plain)
    with open_dict(cfg):
        cfg.hydra = hydra_part
        cfg.hydra.mode = RunMode.RUN
    OmegaConf.set_struct(cfg, True)
    JobRuntime.instance().set("name", cfg.hydra.job.name)
    callbacks = Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name="finetune")
    ret = run_job(hydra_context=HydraContext(config_loader=None, callbacks=callbacks),
                  # ampft's errors end the process with their line and code inside the job, as in the recipe's
                  # own Hydra job (the overrides were checked here, when composing: no arguments, no check)
                  task_function=lambda job_cfg: exit_on_error(lambda: task(job_cfg))(),
                  config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None)
    callbacks.on_run_end(config=cfg, config_name="finetune", job_return=ret)
    ret.return_value  # noqa: B018  (raises the job's exception, as Hydra's run mode does)
    return True


if __name__ == "__main__":
    exit_on_error(main)(sys.argv[1:])

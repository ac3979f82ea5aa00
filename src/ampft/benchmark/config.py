"""The benchmark's schema (`BenchmarkConfig`, conf/benchmark, the primary config `benchmark_recipe`) and each
arm's finetune config: `conf/finetune.yaml` with the benchmark's shared overrides, the mode's and the arm's own
(later wins). Unknown keys and bad modes fail at compose time; `check` reports every other problem at once.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from ampft.benchmark.stats import t_ppf
from ampft.config import CONF_DIR, ConfigError
from ampft.errors import BenchmarkConfigError
from ampft.extras import MissingExtraError
from ampft.models import ModelLoadError, check_loadable
from ampft.tasks import check_installed
from ampft.validation import validate


class Runner(str, Enum):
    """Who trains an arm: ampft, or a run_glue-style transformers.Trainer (accuracy mode only)."""

    trainer = "trainer"
    ampft = "ampft"


class Mode(str, Enum):
    speed = "speed"  # timed steps on synthetic fixed-length batches: step time, throughput, MFU, memory
    accuracy = "accuracy"  # full fine-tuning runs per seed: metric mean/std, difference to the baseline


@dataclass
class ArmConfig:
    """An arm: who trains it and the finetune overrides that make it."""

    name: str = MISSING
    # finetune overrides that make this arm, e.g. [precision=bf16, model.attn_implementation=eager]
    overrides: list[str] = field(default_factory=list)
    # trainer: a run_glue-style transformers.Trainer script (`trainer.run_trainer`), accuracy mode only
    runner: Runner = Runner.ampft
    # the modes this arm takes part in; null: every mode of the benchmark
    modes: list[Mode] | None = None


@dataclass
class SpeedConfig:
    warmup_steps: int = 3  # run, not timed
    timed_steps: int = 10
    overrides: list[str] = field(default_factory=lambda: ["model.pretrained=false"])


@dataclass
class SweepConfig:
    """Peak memory versus batch size, per arm, after the timed steps (the same model and optimizer)."""

    batch_sizes: list[int] = field(default_factory=list)  # measured in this order; [] disables the sweep
    until_oom: bool = True  # CUDA only: keep doubling after the last size until out of memory
    max_batch_size: int = 4096  # CUDA doubling stops here even if it still fits
    steps: int = 1  # optimizer steps per batch size (the peak is reached in the first)
    arms: list[str] | None = None  # null: every speed arm


@dataclass
class AccuracyConfig:
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    overrides: list[str] = field(default_factory=lambda: ["checkpoint.export=false"])
    # each run in its own process with a cold tokenization cache, timed from outside (wall seconds): what a
    # comparison with the Trainer needs (its arms always run so); false: ampft arms train in this process
    isolate: bool = False
    tolerance: float = 1.0  # points of task.main_metric (fractions x 100) an arm may differ from a reference by
    reference: list[str] = field(default_factory=list)  # arms the others' metric is judged against; []: Trainer arms
    # > 0: torch.profiler over this many training steps of every isolated run (after 7 unrecorded ones), the
    # same hook for both runners; the report says where a step's time goes. 0: no profiling (it slows a run).
    profile_steps: int = 0


@dataclass
class Target:
    arm: str = MISSING
    over: str = MISSING
    min_ratio: float = MISSING  # training samples/s of `arm` / samples/s of `over` (accuracy runs, medians)


@dataclass
class PeakTflops:
    """Dense peak TFLOP/s per precision; null: from the table of known devices (none for CPUs)."""

    fp32: float | None = None
    tf32: float | None = None
    fp16: float | None = None
    bf16: float | None = None


@dataclass
class BenchmarkConfig:
    name: str = MISSING
    modes: list[Mode] = field(default_factory=lambda: [Mode.speed, Mode.accuracy])
    model: str = "minilm-l6"  # a conf/model option
    task: str = "demo"  # a conf/task option (accuracy mode trains on it; speed mode uses synthetic data)
    seq_len: int = 128  # task.max_length; speed-mode batches are exactly this long
    batch_size: int = 32  # trainer.batch_size
    seed: int = 42  # trainer.seed in speed mode, and the seed of the synthetic batches
    baseline: str = "fp32"  # the arm the others are compared with
    # wall-clock minutes the whole benchmark may take: arms projected to blow it are shortened or skipped
    # (the policy: ampft.benchmark.runner, docs/benchmarks/README.md#the-time-budget); null: no budget
    budget_minutes: float | None = None
    gpu: bool = False  # true: a GPU's benchmark, refused at once on a machine without one (false measures the CPU)
    overrides: list[str] = field(default_factory=lambda: ["logging=none", "trainer.progress_bar=false"])
    extra: list[str] = field(default_factory=list)  # more shared overrides, for the command line (after those)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    accuracy: AccuracyConfig = field(default_factory=AccuracyConfig)
    peak_tflops: PeakTflops = field(default_factory=PeakTflops)
    arms: list[ArmConfig] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)


# --help lists the recipe's own group, as finetune's does, not every folder of conf/ (the template unresolved).
_help = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "finetune.yaml"))["hydra"]["help"]
ConfigStore.instance().store(name="benchmark_recipe", node={
    "defaults": ["_self_", {"benchmark": "cpu-smoke"}],
    "benchmark": BenchmarkConfig,
    "hydra": {"run": {"dir": "runs/benchmark/${benchmark.name}/${now:%Y-%m-%d_%H-%M-%S}"}, "job": {"name": "benchmark"},
              "help": {"template": _help["template"]}},
})


def _takes_part(b: DictConfig, arm: DictConfig, mode: Mode) -> bool:
    return mode in b.modes and (arm.modes is None or mode in arm.modes)


def arms_for(b: DictConfig, mode: Mode) -> list[DictConfig]:
    """The arms that take part in `mode`, in config order."""
    return [a for a in b.arms if _takes_part(b, a, mode)]


def arm_overrides(b: DictConfig, arm: DictConfig, mode: Mode, seed: int | None = None) -> list[str]:
    """The finetune overrides of one arm in one mode; later entries win."""
    per_mode = b.speed.overrides if mode == Mode.speed else b.accuracy.overrides
    return [f"model={b.model}", f"task={b.task}", f"task.max_length={b.seq_len}",
            f"trainer.batch_size={b.batch_size}", f"trainer.seed={b.seed if seed is None else seed}",
            *b.overrides, *b.extra, *per_mode, *arm.overrides]


def compose_finetune(overrides: list[str], conf_dir: Path = CONF_DIR) -> DictConfig:
    """conf/finetune.yaml with overrides: inside a running Hydra app (the recipe) its search path is
    used; otherwise (tests, notebooks) conf_dir is."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    initialized = GlobalHydra.instance().is_initialized()
    with nullcontext() if initialized else initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        return compose(config_name="finetune", overrides=list(overrides))


# (key, least value, why): where speed./sweep. keys are checked only when speed mode runs
_AT_LEAST = (("seq_len", 8, ""), ("batch_size", 1, ""), ("speed.warmup_steps", 0, ""),
             ("speed.timed_steps", 2, " (a spread needs two)"), ("sweep.steps", 1, ""))


def check(b: DictConfig, conf_dir: Path = CONF_DIR) -> dict[tuple[str, str, int | None], DictConfig]:
    """Validate the benchmark and compose every finetune config it will run; raise with all problems.

    Returns {(mode, arm name, seed): cfg}; seed is None in speed mode (it uses benchmark.seed). Composing
    everything up front also means a config file edited while the benchmark runs cannot change it midway."""
    modes, names, seeds = [Mode(m) for m in b.modes], [a.name for a in b.arms], list(b.accuracy.seeds)
    speed, acc, sw = Mode.speed in modes, Mode.accuracy in modes, b.sweep
    dupes = sorted({n for n in names if names.count(n) > 1})
    ref_unknown = [a for a in b.accuracy.reference if a not in names]
    sweep_unknown = [a for a in sw.arms or [] if a not in names]
    bad_peaks = {k: v for k, v in b.peak_tflops.items() if v is not None and v <= 0}
    rules = [  # (is a problem, its message)
        (not modes, "benchmark.modes is empty: use [speed], [accuracy] or [speed, accuracy]"),
        (not names, "benchmark.arms is empty: give at least two arms, e.g. "
                    "[{name: fp32, overrides: [precision=fp32]}, {name: bf16, overrides: [precision=bf16]}]"),
        (dupes, f"benchmark.arms has duplicate names {dupes}: each arm needs its own name"),
        *((arm.runner == Runner.trainer and _takes_part(b, arm, Mode.speed),
           f"benchmark.arms[{i}] ({arm.name}): runner=trainer in speed mode, which times ampft's own step: give "
           "the arm modes: [accuracy]") for i, arm in enumerate(b.arms)),
        *((t.arm not in names or t.over not in names,
           f"benchmark.targets[{i}]: {t.arm} over {t.over}: both must be arms ({names})")
          for i, t in enumerate(b.targets)),
        *((t.min_ratio <= 0, f"benchmark.targets[{i}].min_ratio={t.min_ratio}: must be > 0")
          for i, t in enumerate(b.targets)),
        (ref_unknown, f"benchmark.accuracy.reference has {ref_unknown}: not arms ({names})"),
        (b.accuracy.profile_steps < 0, f"benchmark.accuracy.profile_steps={b.accuracy.profile_steps}: give 0 (no "
                                       "profiling) or a number of steps, e.g. 20"),
        (acc and b.accuracy.profile_steps > 0 and not b.accuracy.isolate
         and any(a.runner == Runner.ampft for a in arms_for(b, Mode.accuracy)),
         f"benchmark.accuracy.profile_steps={b.accuracy.profile_steps} profiles the runs that have their own process: "
         "add benchmark.accuracy.isolate=true, or ampft's arms train in this process unprofiled"),
        (names and b.baseline not in names, f"benchmark.baseline={b.baseline} is not an arm: choose one of {names}"),
        *((OmegaConf.select(b, key) < least, f"benchmark.{key}={OmegaConf.select(b, key)}: must be >= {least}{why}")
          for key, least, why in _AT_LEAST if speed or not key.startswith(("speed.", "sweep."))),
        (b.budget_minutes is not None and not b.budget_minutes > 0,
         f"benchmark.budget_minutes={b.budget_minutes}: must be > 0, or null for no budget"),
        (speed and (any(n < 1 for n in sw.batch_sizes) or list(sw.batch_sizes) != sorted(set(sw.batch_sizes))),
         f"benchmark.sweep.batch_sizes={list(sw.batch_sizes)}: positive and increasing, e.g. [4, 8, 16]"),
        (speed and sweep_unknown, f"benchmark.sweep.arms has {sweep_unknown}: not arms; choose from {names}"),
        (acc and not seeds, "benchmark.accuracy.seeds is empty: give several seeds, e.g. [1, 2, 3]"),
        (acc and len(seeds) != len(set(seeds)), f"benchmark.accuracy.seeds={seeds} repeats a seed"),
        (bad_peaks, f"benchmark.peak_tflops has non-positive values {bad_peaks}: give TFLOP/s > 0 or null"),
        *((True, f"{where}: {o} would give every run one seed: the seeds are benchmark.seed (speed mode) and "
                 "benchmark.accuracy.seeds") for where, o in _seed_overrides(b)),
    ]
    problems = [message for bad, message in rules if bad]
    cfgs: dict[tuple[str, str, int | None], DictConfig] = {}
    for mode in modes:
        arms = arms_for(b, mode)
        if b.arms and not arms:
            problems.append(f"benchmark.modes has {mode.value} but no arm takes part in it (see arms[].modes)")
        if arms and b.baseline in names and b.baseline not in [a.name for a in arms]:
            problems.append(f"benchmark.baseline={b.baseline} does not take part in {mode.value} mode: "
                            f"remove {mode.value} from its arms[].modes restriction")
        mode_seeds = (seeds if mode == Mode.accuracy else []) or [None]  # none: a problem above
        for arm in arms:
            where = f"benchmark.arms[{names.index(arm.name)}] ({arm.name}, {mode.value} mode)"
            try:
                cfg = compose_finetune(arm_overrides(b, arm, mode, mode_seeds[0]), conf_dir)
            except Exception as exc:  # Hydra's composition errors: unknown key, bad option, bad value
                cause = str(exc.__cause__ or exc).split("Config search path")[0]
                problems.append(f"{where}: the finetune overrides do not compose: " + " ".join(cause.split()))
                continue
            if arm.runner == Runner.trainer and cfg.task.family != "classification":
                problems.append(f"{where}: the trainer runner is run_glue-style, sequence classification only")
            try:
                validate(cfg)
            except ConfigError as exc:
                problems.extend(f"{where}: {p}" for p in exc.problems)
                continue
            if cfg.model.pretrained:  # fail now, not after the speed arms have run (a Hub name offline)
                try:
                    check_loadable(cfg.model.name_or_path, f"model {cfg.model.name}", "model.name_or_path")
                except ModelLoadError as exc:
                    problems.append(f"{where}: {exc}".replace("\n", " "))
            if mode == Mode.speed and cfg.trainer.grad_accum != 1:
                problems.append(f"{where}: trainer.grad_accum={cfg.trainer.grad_accum}; speed mode times "
                                "single micro-batch steps, use trainer.grad_accum=1")
            cfgs[(mode.value, arm.name, mode_seeds[0])] = cfg
            for seed in mode_seeds[1:]:  # the same config but for trainer.seed (no override sets it: a rule above)
                cfgs[(mode.value, arm.name, seed)] = other = copy.deepcopy(cfg)
                other.trainer.seed = seed
    if acc_cfg := next((cfg for (mode, *_), cfg in cfgs.items() if mode == Mode.accuracy.value), None):
        problems += _extras(b, acc_cfg)
    if problems:
        raise BenchmarkConfigError(problems)
    return cfgs


def _seed_overrides(b: DictConfig) -> list[tuple[str, str]]:
    """(where, override) for each override that sets trainer.seed, which the benchmark sets per run."""
    lists = [("benchmark.overrides", b.overrides), ("benchmark.extra", b.extra),
             ("benchmark.speed.overrides", b.speed.overrides), ("benchmark.accuracy.overrides", b.accuracy.overrides),
             *((f"benchmark.arms[{i}] ({a.name})", a.overrides) for i, a in enumerate(b.arms))]
    return [(where, o) for where, overrides in lists for o in overrides
            if o.split("=")[0].lstrip("+~") == "trainer.seed"]


def _extras(b: DictConfig, cfg: DictConfig) -> list[str]:
    """Accuracy mode's metrics and confidence intervals need the `metrics` extra: said before measuring. Speed
    mode needs no extra; plots are skipped with a warning when matplotlib is missing."""
    problems = []
    try:
        check_installed(cfg.task.metrics, key=f"benchmark.task={b.task}: task.metrics")
    except ConfigError as exc:
        problems += exc.problems
    try:
        if len(b.accuracy.seeds) > 1:
            t_ppf(0.975, 1)
    except MissingExtraError as exc:
        problems.append(f"benchmark.accuracy.seeds={list(b.accuracy.seeds)}: {exc}")
    return problems

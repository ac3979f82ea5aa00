"""ampft against the plain Hugging Face Trainer: same model, data, hyper-parameters and precision.

`make benchmark-peer` (recipes/peer.py, conf/peer/*.yaml) runs each arm in a fresh Python process, one
after the other, and writes results.json and report.md:

- `trainer` arms: a run_glue-style script. `transformers.Trainer` with the same model weights, examples
  (ampft's loader, so `task.max_train_samples` etc. apply alike), batch size, learning rate, epochs,
  warm-up, weight decay, gradient clipping, seed and precision. It honours `trainer.padding`
  (max_length: run_glue's default `pad_to_max_length`; longest: `DataCollatorWithPadding`),
  `trainer.group_by_length` and `trainer.compile`; everything else is the Trainer's default.
- `ampft` arms: `ampft.finetune.run` with the arm's finetune overrides, e.g. one fast path switched off.

Per arm: training samples/s and non-padding tokens/s (over the training loop alone), the process's wall
time (interpreter start to exit: imports, model, tokenization, training, evaluation), the evaluation
metric, peak RSS (CPU) or CUDA peak, and model FLOP/s over non-padding tokens (MFU where the device's
peak is known). Each ampft arm starts with an empty tokenization cache, so both pay for tokenizing.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from statistics import mean, median, stdev

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from ampft.benchmark.config import (
    CONF_DIR,
    BenchmarkConfigError,
    compose_arm,
    loadability_problems,
    validation_problems,
)
from ampft.benchmark.environment import OtherLoad, describe

log = logging.getLogger(__name__)


class Runner(str, Enum):
    trainer = "trainer"  # transformers.Trainer, run_glue style
    ampft = "ampft"


@dataclass
class PeerArm:
    name: str = MISSING
    runner: Runner = MISSING
    overrides: list[str] = field(default_factory=list)  # finetune overrides, after the shared ones


@dataclass
class Target:
    arm: str = MISSING
    over: str = MISSING
    min_ratio: float = MISSING  # training samples/s of `arm` / samples/s of `over`


@dataclass
class PeerConfig:
    name: str = MISSING
    overrides: list[str] = field(default_factory=list)  # shared finetune overrides: model, task, batch, lr, ...
    extra: list[str] = field(default_factory=list)  # more shared overrides, from the command line (after those)
    seeds: list[int] = field(default_factory=lambda: [42])  # each arm runs once per seed
    arms: list[PeerArm] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    accuracy_tolerance: float = 1.0  # points of task.main_metric (fractions x 100) every arm may differ by
    accuracy_reference: list[str] = field(default_factory=list)  # arms the others' metric is compared with
    peak_tflops: float | None = None  # the device's dense peak for the precision run; null: known GPUs only


ConfigStore.instance().store(
    name="peer_recipe",
    node={
        "defaults": ["_self_", {"peer": "sst2-minilm"}],
        "peer": PeerConfig,
        "hydra": {"run": {"dir": "runs/benchmark-peer/${peer.name}/${now:%Y-%m-%d_%H-%M-%S}"},
                  "job": {"name": "benchmark-peer"}},
    },
)


def check(p: DictConfig, conf_dir: Path = CONF_DIR) -> dict[str, DictConfig]:
    """Compose and validate every arm's finetune config; raise with every problem at once."""
    problems: list[str] = []
    names = [a.name for a in p.arms]
    if len(names) < 2:
        problems.append("peer.arms: give at least two arms (a trainer arm and an ampft arm)")
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"peer.arms has duplicate names {dupes}")
    if not p.seeds or len(set(p.seeds)) != len(p.seeds):
        problems.append(f"peer.seeds={list(p.seeds)}: give one or more distinct seeds")
    for i, t in enumerate(p.targets):
        if t.arm not in names or t.over not in names:
            problems.append(f"peer.targets[{i}]: {t.arm} over {t.over}: both must be arms ({names})")
        if t.min_ratio <= 0:
            problems.append(f"peer.targets[{i}].min_ratio={t.min_ratio}: must be > 0")
    if unknown := [a for a in p.accuracy_reference if a not in names]:
        problems.append(f"peer.accuracy_reference has {unknown}: not arms ({names})")
    cfgs: dict[str, DictConfig] = {}
    for i, arm in enumerate(p.arms):
        where = f"peer.arms[{i}] ({arm.name})"
        cfg = compose_arm([*p.overrides, *p.extra, *arm.overrides], where, problems, conf_dir)
        if cfg is None:
            continue
        if Runner(arm.runner) == Runner.trainer and cfg.task.family != "classification":
            problems.append(f"{where}: the trainer runner is run_glue-style, sequence classification only")
        if invalid := validation_problems(cfg, where):
            problems.extend(invalid)
            continue
        problems.extend(loadability_problems(cfg, where))  # fail now, not after other arms have run
        cfgs[arm.name] = cfg
    if problems:
        raise BenchmarkConfigError(problems)
    return cfgs


# ---------------------------------------------------------------------------------------------------------
# one arm, in its own process: `python -m ampft.benchmark.peer SPEC OUT`


def useful_flops(model: torch.nn.Module, lengths: list[int], epochs: float) -> float:
    """Training FLOPs over the non-padding tokens: sum over examples of 6N·s + 12·L·h·s² (ampft.benchmark.flops'
    formula per token, at each example's own length s), times the epochs run. Padding FLOPs do not count."""
    from ampft.benchmark.flops import encoder_dims, nonembedding_params

    layers, hidden = encoder_dims(model.config)
    n = nonembedding_params(model)
    s = torch.tensor(lengths, dtype=torch.float64)
    return float((6 * n * s + 12 * layers * hidden * s * s).sum()) * epochs


def run_ampft(cfg: DictConfig, out_dir: Path) -> dict:
    from ampft.finetune import run

    s = run(cfg, out_dir / "run")
    return dict(
        samples_per_second=s["train_samples_per_second"], tokens_per_second=s["train_tokens_per_second"],
        train_seconds=s["train_seconds"], setup_seconds=s["setup_seconds"], steps=s["steps"],
        epochs=s["epochs"], eval=s["eval"],
        attn_implementation=s["attn_implementation"], device=s["device"], precision=s["precision"],
        peak_memory_bytes=s["peak_memory_bytes"], peak_memory_kind=s["peak_memory_kind"],
    )


def run_trainer(cfg: DictConfig, out_dir: Path) -> dict:
    """A run_glue-style fine-tuning with transformers.Trainer (see the module docstring)."""
    import numpy as np
    import transformers
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments, default_data_collator

    from ampft.config import Padding, Precision
    from ampft.models import build_model, load_tokenizer
    from ampft.tasks import family_for
    from ampft.tasks.classification import texts
    from ampft.tracking import peak_memory_bytes

    started = time.perf_counter()
    tr, task, o, sch = cfg.trainer, cfg.task, cfg.optim, cfg.scheduler
    transformers.set_seed(tr.seed)  # as run_glue: before the model (the classifier's initialisation)
    tokenizer = load_tokenizer(cfg.model)
    family = family_for(task.family)
    raw, labels = family.load(task)
    model = build_model(cfg.model, tokenizer, labels, family, cfg.precision.name)
    pad = tr.padding == Padding.max_length
    fields = list(task.text_fields)

    def preprocess(batch):
        enc = tokenizer(*texts(batch, fields), padding="max_length" if pad else False, max_length=task.max_length,
                        truncation=True)
        enc["length"] = [sum(m) for m in enc["attention_mask"]]
        return enc

    data = {s: raw[s].map(preprocess, batched=True) for s in ("train", "validation")}
    mixed = cfg.precision.name in (Precision.fp16, Precision.bf16)
    collator = default_data_collator if pad else DataCollatorWithPadding(tokenizer,
                                                                         pad_to_multiple_of=8 if mixed else None)
    cpu = tr.cpu or not torch.cuda.is_available()
    args = TrainingArguments(
        output_dir=str(out_dir / "trainer"), per_device_train_batch_size=tr.batch_size,
        per_device_eval_batch_size=tr.eval_batch_size or 2 * tr.batch_size, gradient_accumulation_steps=tr.grad_accum,
        learning_rate=o.lr, weight_decay=o.weight_decay, adam_beta1=o.betas[0], adam_beta2=o.betas[1],
        adam_epsilon=o.eps, max_grad_norm=tr.max_grad_norm, num_train_epochs=tr.epochs, max_steps=tr.max_steps,
        lr_scheduler_type=sch.name.value, warmup_steps=sch.warmup_steps if sch.warmup_steps > 0 else sch.warmup_ratio,
        seed=tr.seed, bf16=cfg.precision.name == Precision.bf16, fp16=cfg.precision.name == Precision.fp16,
        tf32=None if cfg.precision.name == Precision.fp32 else cfg.precision.name == Precision.tf32,
        use_cpu=cpu, logging_steps=tr.log_every, save_strategy="no", eval_strategy="no", report_to="none",
        disable_tqdm=True, train_sampling_strategy="group_by_length" if tr.group_by_length else "random",
        length_column_name="length", torch_compile=bool(tr.compile),
    )
    trainer = Trainer(model=model, args=args, train_dataset=data["train"], eval_dataset=data["validation"],
                      data_collator=collator, processing_class=tokenizer,
                      compute_metrics=lambda p: {"accuracy": float((np.argmax(p.predictions, -1) == p.label_ids)
                                                                   .mean())})
    setup_seconds = time.perf_counter() - started
    train = trainer.train().metrics
    ev = trainer.evaluate()
    epochs = float(train.get("epoch", tr.epochs))
    tokens = sum(data["train"]["length"]) * epochs
    device = trainer.args.device
    peak, peak_kind = peak_memory_bytes(device)
    return dict(
        samples_per_second=train["train_samples_per_second"], tokens_per_second=tokens / train["train_runtime"],
        train_seconds=train["train_runtime"], setup_seconds=setup_seconds, steps=trainer.state.global_step,
        epochs=epochs, eval={k.removeprefix("eval_"): v for k, v in ev.items() if k in ("eval_accuracy", "eval_loss")},
        attn_implementation=model.config._attn_implementation, device=str(device),
        precision=cfg.precision.name.value, peak_memory_bytes=peak, peak_memory_kind=peak_kind,
    )


def _child(spec_path: str, out_path: str) -> None:
    from ampft.config import FinetuneConfig

    spec = json.loads(Path(spec_path).read_text())
    cfg = OmegaConf.merge(OmegaConf.structured(FinetuneConfig), OmegaConf.create(spec["cfg"]))
    out_dir = Path(spec["out_dir"])
    result = (run_trainer if Runner(spec["runner"]) == Runner.trainer else run_ampft)(cfg, out_dir)
    Path(out_path).write_text(json.dumps(result, indent=1, default=str))


def epoch_flops(cfg: DictConfig) -> tuple[int, float]:
    """(training examples, training FLOPs of one epoch over their non-padding tokens) for an arm's config."""
    from ampft.models import build_model, load_tokenizer
    from ampft.tasks import family_for
    from ampft.tasks.classification import texts

    tokenizer = load_tokenizer(cfg.model)
    family = family_for(cfg.task.family)
    raw, labels = family.load(cfg.task)
    encoded = tokenizer(*texts(raw["train"], list(cfg.task.text_fields)), truncation=True,
                        max_length=cfg.task.max_length)
    lengths = [len(ids) for ids in encoded["input_ids"]]
    shape_only = OmegaConf.merge(cfg.model, {"pretrained": False})  # the parameter count, no weights needed
    model = build_model(shape_only, tokenizer, labels, family)
    return len(lengths), useful_flops(model, lengths, 1.0)


# ---------------------------------------------------------------------------------------------------------
# the orchestrator


def run_peer(p: DictConfig, out_dir: str | Path, command: str | None = None) -> Path:
    out_dir = Path(out_dir)
    cfgs = check(p)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = describe(torch.device("cuda" if torch.cuda.is_available() and not any(
        c.trainer.cpu for c in cfgs.values()) else "cpu"))
    runs = []
    for seed in p.seeds:
        for arm in p.arms:
            cfg = OmegaConf.merge(cfgs[arm.name], {"trainer": {"seed": seed}})
            log.info("arm %s (%s), seed %d", arm.name, Runner(arm.runner).value, seed)
            runs.append(dict(arm=arm.name, runner=Runner(arm.runner).value, seed=seed,
                             overrides=list(arm.overrides), **_run_arm(arm, cfg, out_dir / f"{arm.name}-seed{seed}")))
            r = runs[-1]
            log.info("  %.1f samples/s, %.1f s training, %.1f s wall, %s", r["samples_per_second"],
                     r["train_seconds"], r["wall_seconds"], r["eval"])
    flops: dict[str, tuple[int, float]] = {}
    for r in runs:  # per distinct model/task/length settings, after the timed runs
        cfg = cfgs[r["arm"]]
        key = json.dumps(OmegaConf.to_container(OmegaConf.masked_copy(cfg, ["model", "task"]), resolve=True),
                         sort_keys=True, default=str)
        if key not in flops:
            flops[key] = epoch_flops(cfg)
        r["train_examples"], per_epoch = flops[key]
        r["model_tflops"] = per_epoch * r["epochs"] / r["train_seconds"] / 1e12
    results = summarize(p, cfgs, runs, env, command)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    return write_report(results, out_dir)


def _points(value: float | None) -> float | None:
    """Metrics in [0, 1] (GLUE's fractions) as percentage points; others as they are."""
    return None if value is None else (100 * value if abs(value) <= 1 else value)


def summarize(p: DictConfig, cfgs: dict[str, DictConfig], runs: list[dict], env: dict, command: str | None) -> dict:
    """Per arm over seeds (medians for speed, means for the metric), speed ratios, targets and accuracy checks."""
    from ampft.benchmark.flops import mfu, peak_tflops

    first = cfgs[p.arms[0].name]
    metric = first.task.main_metric
    arms = {}
    for arm in p.arms:
        rs = [r for r in runs if r["arm"] == arm.name]
        cfg = cfgs[arm.name]
        peak, peak_source = peak_tflops(rs[0]["precision"], env["device_type"], env["device_name"],
                                        {rs[0]["precision"]: p.peak_tflops})
        tflops = median(r["model_tflops"] for r in rs)
        arms[arm.name] = dict(
            runner=Runner(arm.runner).value, overrides=list(arm.overrides),
            samples_per_second=median(r["samples_per_second"] for r in rs),
            tokens_per_second=median(r["tokens_per_second"] for r in rs),
            train_seconds=median(r["train_seconds"] for r in rs),
            wall_seconds=median(r["wall_seconds"] for r in rs),
            setup_seconds=median(r["setup_seconds"] for r in rs),
            metric=mean(_points(r["eval"][metric]) for r in rs),
            metric_per_seed=[_points(r["eval"][metric]) for r in rs],
            metric_std=stdev(_points(r["eval"][metric]) for r in rs) if len(rs) > 1 else None,
            samples_per_second_per_seed=[r["samples_per_second"] for r in rs],
            peak_memory_bytes=max(r["peak_memory_bytes"] for r in rs), peak_memory_kind=rs[0]["peak_memory_kind"],
            model_tflops=tflops, mfu=mfu(tflops, peak), peak_tflops=peak,
            peak_tflops_source=peak_source.replace("benchmark.peak_tflops." + rs[0]["precision"], "peer.peak_tflops"),
            precision=rs[0]["precision"], attn_implementation=rs[0]["attn_implementation"],
            padding=cfg.trainer.padding.value, group_by_length=bool(cfg.trainer.group_by_length),
            compile=bool(cfg.trainer.compile), steps=rs[0]["steps"], train_examples=rs[0]["train_examples"],
            other_load=max((r["other_load"] or 0.0) for r in rs),
        )
    trainers = [n for n, a in arms.items() if a["runner"] == Runner.trainer.value]
    for a in arms.values():
        a["speedup"] = {t: a["samples_per_second"] / arms[t]["samples_per_second"] for t in trainers}
    targets = [dict(arm=t.arm, over=t.over, min_ratio=t.min_ratio,
                    ratio=arms[t.arm]["samples_per_second"] / arms[t.over]["samples_per_second"]) for t in p.targets]
    for t in targets:
        t["met"] = t["ratio"] >= t["min_ratio"]
    references = list(p.accuracy_reference) or trainers
    accuracy = [dict(arm=n, reference=ref, difference=arms[n]["metric"] - arms[ref]["metric"],
                     within=abs(arms[n]["metric"] - arms[ref]["metric"]) <= p.accuracy_tolerance)
                for ref in references for n in arms if n != ref]
    c = first
    setup = dict(model=c.model.name, task=c.task.name, train_file=c.task.train_file, validation_file=c.task.validation_file,
                 max_train_samples=c.task.max_train_samples, max_length=c.task.max_length,
                 batch_size=c.trainer.batch_size, lr=c.optim.lr, epochs=c.trainer.epochs, max_steps=c.trainer.max_steps,
                 precision=c.precision.name.value, seeds=list(p.seeds), metric=metric)
    return dict(name=p.name, command=command, environment=env, setup=setup, arms=arms, targets=targets,
                accuracy=accuracy, accuracy_tolerance=p.accuracy_tolerance, runs=runs,
                config=OmegaConf.to_container(p, resolve=True))


def write_report(results: dict, out_dir: Path) -> Path:
    env, setup, arms = results["environment"], results["setup"], results["arms"]
    trainers = [n for n, a in arms.items() if a["runner"] == Runner.trainer.value]
    mib = 2 ** 20
    lines = [
        f"# ampft vs the Hugging Face Trainer: {results['name']}",
        "",
        f"Measured {env['date']} on {env['device_name']} ({env['cpu_count']} CPU cores, torch threads "
        f"{env['torch_threads']}); torch {env['torch']}, transformers {env['transformers']}, accelerate "
        f"{env['accelerate']}, Python {env['python']}.",
        "",
        f"Same for every arm: model {setup['model']}, task {setup['task']} ({setup['train_file'] or 'Hub'}), "
        f"{next(iter(arms.values()))['train_examples']} training examples, max length {setup['max_length']}, "
        f"batch {setup['batch_size']}, lr {setup['lr']:g}, {setup['epochs']:g} epoch(s), {setup['precision']}, "
        f"seeds {setup['seeds']}. Each arm runs in its own process, one at a time.",
        "",
        f"Command: `{results['command'] or 'run_peer(...)'}`",
        "",
        "| arm | runner | differs by | samples/s | tokens/s | training s | wall s | "
        f"{setup['metric']} | peak MiB | " + " | ".join(f"x {t}" for t in trainers) + " |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(trainers),
    ]
    for name, a in arms.items():
        differs = ", ".join(a["overrides"]) or "(defaults)"
        metric = f"{a['metric']:.2f}" + ("" if a["metric_std"] is None else f" ± {a['metric_std']:.2f}")
        lines.append(f"| {name} | {a['runner']} | {differs} | {a['samples_per_second']:.1f} | "
                     f"{a['tokens_per_second']:.0f} | {a['train_seconds']:.1f} | {a['wall_seconds']:.1f} | "
                     f"{metric} | {a['peak_memory_bytes'] / mib:.0f} | "
                     + " | ".join(f"{a['speedup'][t]:.2f}" for t in trainers) + " |")
    lines += ["", "samples/s and tokens/s (non-padding) are over the training loop; wall is the whole process "
              "(imports, model, tokenization, training, evaluation). Peak memory: "
              f"{next(iter(arms.values()))['peak_memory_kind']}.", ""]
    if len(setup["seeds"]) > 1:
        lines += [f"With {len(setup['seeds'])} seeds: samples/s, times and memory are medians, {setup['metric']} "
                  "is the mean ± standard deviation. Per seed:", "",
                  "| arm | " + " | ".join(f"seed {s} samples/s | seed {s} {setup['metric']}" for s in setup["seeds"])
                  + " |", "|---|" + "---:|---:|" * len(setup["seeds"])]
        for name, a in arms.items():
            lines.append(f"| {name} | " + " | ".join(f"{v:.1f} | {m:.2f}" for v, m in
                                                      zip(a["samples_per_second_per_seed"], a["metric_per_seed"],
                                                          strict=True)) + " |")
        lines.append("")
    mfus = {n: a["mfu"] for n, a in arms.items() if a["mfu"] is not None}
    first = next(iter(arms.values()))
    lines += ["Model FLOP/s over non-padding tokens (6N + 12·L·h·s per token, per example's length): "
              + ", ".join(f"{n} {a['model_tflops'] * 1e3:.2f} GFLOP/s" for n, a in arms.items()) + ". "
              + (("MFU: " + ", ".join(f"{n} {v:.1%}" for n, v in mfus.items()) + f" of {first['peak_tflops']:g} "
                  f"TFLOP/s ({first['peak_tflops_source']}).") if mfus else f"MFU: {first['peak_tflops_source']}."),
              "", "## Targets", ""]
    for t in results["targets"]:
        lines.append(f"- {t['arm']} at least {t['min_ratio']:g}x the samples/s of {t['over']}: measured "
                     f"{t['ratio']:.2f}x, **{'met' if t['met'] else 'NOT met'}**.")
    tol = results["accuracy_tolerance"]
    for acc in results["accuracy"]:
        lines.append(f"- {acc['arm']} {setup['metric']} within {tol:g} point(s) of {acc['reference']}: "
                     f"{acc['difference']:+.2f}, **{'yes' if acc['within'] else 'NO'}**.")
    loaded = {n: a["other_load"] for n, a in arms.items() if a["other_load"] > 0.1}
    if loaded:
        lines += ["", "**Warning**: other processes used CPU while these arms ran (share of the machine): "
                  + ", ".join(f"{n} {v:.0%}" for n, v in loaded.items()) + "; their timings are unreliable."]
    ampft = [n for n, a in arms.items() if a["runner"] == Runner.ampft.value and not a["overrides"]]
    ablations = [a for a in arms.values() if a["runner"] == Runner.ampft.value and a["overrides"]]
    if ampft and ablations:
        base = arms[ampft[0]]
        lines += ["", f"## What each fast path contributes (relative to {ampft[0]})", ""]
        for a in ablations:
            lines.append(f"- {', '.join(a['overrides'])}: {a['samples_per_second'] / base['samples_per_second']:.2f}x "
                         f"the samples/s, {a['wall_seconds'] / base['wall_seconds']:.2f}x the wall time")
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def rerender(out_dir: str | Path) -> Path:
    """Summarize and write report.md again from a run's results.json (its config, environment and raw runs)."""
    out_dir = Path(out_dir)
    old = json.loads((out_dir / "results.json").read_text())
    p = OmegaConf.merge(OmegaConf.structured(PeerConfig), old["config"])
    results = summarize(p, check(p), old["runs"], old["environment"], old["command"])
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    return write_report(results, out_dir)


def _run_arm(arm: DictConfig, cfg: DictConfig, arm_dir: Path) -> dict:
    from ampft.config import to_plain

    arm_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ampft-peer-cache-") as cache:
        plain = to_plain(cfg)
        plain["cache_dir"] = cache  # a cold tokenization cache: ampft pays for tokenizing, as the Trainer does
        spec = arm_dir / "spec.json"
        spec.write_text(json.dumps(dict(runner=Runner(arm.runner).value, cfg=plain, out_dir=str(arm_dir))))
        out = arm_dir / "result.json"
        env = dict(os.environ, HF_DATASETS_CACHE=str(Path(cache) / "datasets"), TOKENIZERS_PARALLELISM="false")
        with OtherLoad() as load:
            tic = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "ampft.benchmark.peer", str(spec), str(out)],
                                  env=env, capture_output=True, text=True)
            wall = time.perf_counter() - tic
    (arm_dir / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"arm {arm.name} failed (exit {proc.returncode}); its log: {arm_dir / 'log.txt'}\n{tail}")
    return dict(json.loads(out.read_text()), wall_seconds=wall, other_load=load.share)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    _child(*sys.argv[1:3])

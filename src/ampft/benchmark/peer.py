"""ampft against the plain Hugging Face Trainer (`make benchmark-peer`, recipes/peer.py, conf/peer/*.yaml): same
model, data, hyper-parameters and precision; each arm a `Runner` (trainer | ampft) and finetune overrides.

check (`config.check_peer`) → each arm × seed in its own process (`trainer`, one at a time) → after every seed:
FLOPs over the non-padding tokens → `results.summarize_peer` → results.json and report.md (`report.write_outputs`,
so a stopped benchmark keeps the seeds it finished). Seeds measured in separate runs become one report through
the same summary (`ampft.benchmark.combine`).

Per arm: training samples/s and non-padding tokens/s (over the training loop alone), the process's wall time
(interpreter start to exit: imports, model, tokenization, training, evaluation), the evaluation metric, peak RSS
(CPU) or CUDA peak, and model FLOP/s over non-padding tokens (`ampft.benchmark.flops`; MFU where the device's
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
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from ampft.benchmark.config import Runner, check_peer
from ampft.benchmark.environment import OtherLoad, describe
from ampft.benchmark.flops import training_flops
from ampft.benchmark.report import write_outputs
from ampft.benchmark.results import summarize_peer
from ampft.config import to_plain
from ampft.models import build_model, load_tokenizer
from ampft.tasks import family_for
from ampft.tasks.classification import texts

log = logging.getLogger(__name__)


def run_peer(p: DictConfig, out_dir: str | Path, command: str | None = None) -> Path:
    """Run every arm of peer config `p` once per seed; write results.json and report.md into out_dir; return
    report.md."""
    out_dir = Path(out_dir)
    cfgs = check_peer(p)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = describe(torch.device("cuda" if torch.cuda.is_available() and not any(
        c.trainer.cpu for c in cfgs.values()) else "cpu"))
    runs: list[dict] = []
    flops: dict[str, tuple[int, float]] = {}
    for done, seed in enumerate(p.seeds, start=1):
        for arm in p.arms:
            cfg = OmegaConf.merge(cfgs[arm.name], {"trainer": {"seed": seed}})
            log.info("arm %s (%s), seed %d", arm.name, Runner(arm.runner).value, seed)
            record = _run_arm(arm, cfg, out_dir / f"{arm.name}-seed{seed}", p.profile_steps)
            runs.append(dict(record, arm=arm.name, runner=Runner(arm.runner).value, seed=seed,
                             overrides=list(arm.overrides)))
            r = runs[-1]
            log.info("  %.1f samples/s, %.1f s training, %.1f s wall, %s", r["train_samples_per_second"],
                     r["train_seconds"], r["wall_seconds"], r["eval"])
        # A report after every seed: a benchmark stopped later (killed, out of time) keeps what it measured.
        path = _report(OmegaConf.merge(p, {"seeds": list(p.seeds)[:done]}), cfgs, runs, flops, env, command, out_dir,
                       requested=list(p.seeds))
        log.info("report over seed(s) %s: %s", list(p.seeds)[:done], path)
    return path


def _report(p: DictConfig, cfgs: dict[str, DictConfig], runs: list[dict], flops: dict, env: dict,
            command: str | None, out_dir: Path, requested: list[int]) -> Path:
    for r in runs:  # FLOPs per distinct model/task/length settings, between the timed runs
        cfg = cfgs[r["arm"]]
        key = json.dumps(OmegaConf.to_container(OmegaConf.masked_copy(cfg, ["model", "task"]), resolve=True),
                         sort_keys=True, default=str)
        if key not in flops:
            flops[key] = epoch_flops(cfg)
        r["train_examples"], per_epoch = flops[key]
        r["model_tflops"] = per_epoch * r["epochs"] / r["train_seconds"] / 1e12
    results = summarize_peer(p, cfgs, runs, env, command)
    results["seeds_requested"] = requested
    return write_outputs(results, out_dir)


def epoch_flops(cfg: DictConfig) -> tuple[int, float]:
    """(training examples, training FLOPs of one epoch over their non-padding tokens) for an arm's config."""

    tokenizer = load_tokenizer(cfg.model)
    family = family_for(cfg.task.family)
    raw, labels = family.load(cfg.task)
    encoded = tokenizer(*texts(raw["train"], list(cfg.task.text_fields)), truncation=True,
                        max_length=cfg.task.max_length)
    lengths = [len(ids) for ids in encoded["input_ids"]]
    shape_only = OmegaConf.merge(cfg.model, {"pretrained": False})  # the parameter count, no weights needed
    model = build_model(shape_only, tokenizer, labels, family)
    return len(lengths), float(training_flops(model, lengths))


def _run_arm(arm: DictConfig, cfg: DictConfig, arm_dir: Path, profile_steps: int = 0) -> dict:
    """The parent's side of the protocol: spec.json in, result.json out (`trainer.main`), timed from outside."""

    arm_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ampft-peer-cache-") as cache:
        plain = to_plain(cfg)
        plain["cache_dir"] = cache  # a cold tokenization cache: ampft pays for tokenizing, as the Trainer does
        spec = arm_dir / "spec.json"
        spec.write_text(json.dumps(dict(runner=Runner(arm.runner).value, arm=arm.name, cfg=plain, out_dir=str(arm_dir),
                                        profile_steps=profile_steps)))
        out = arm_dir / "result.json"
        env = dict(os.environ, HF_DATASETS_CACHE=str(Path(cache) / "datasets"), TOKENIZERS_PARALLELISM="false")
        with OtherLoad() as load:
            tic = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "ampft.benchmark.trainer", str(spec), str(out)],
                                  env=env, capture_output=True, text=True)
            wall = time.perf_counter() - tic
    (arm_dir / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"arm {arm.name} failed (exit {proc.returncode}); its log: {arm_dir / 'log.txt'}\n{tail}")
    return dict(json.loads(out.read_text()), wall_seconds=wall, other_load=load.share)

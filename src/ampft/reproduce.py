"""A paper recipe (conf/experiment/) run on a budget, its scores next to the published ones.

    make reproduce experiment=sst2-bert-base steps=200 [model=minilm-l6] [task.train_file=... ...]
    make reproduce experiment=squad-bert-base minutes=10 ...

`steps=N` sets trainer.max_steps=N (the schedule compressed into N steps); `minutes=M` sets
trainer.max_minutes=M (the schedule as planned, stopped when time is up). Every other argument is a
`make finetune` override, and the run goes through its launcher; afterwards RUN_DIR/reproduce.md and
reproduce.json set the scores next to the experiment's `published:` block and say how much of the recipe
the budget covered: whether the recipe is on track, not the published numbers themselves.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from ampft.data.load import extra_split_names
from ampft.errors import ConfigError, exit_on_error
from ampft.launch import compose
from ampft.tasks import family_for


def _budget(argv: list[str]) -> tuple[dict[str, float], list[str]]:
    budget, rest = {}, []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in ("steps", "minutes"):
            try:
                budget[key] = int(value) if key == "steps" else float(value)
            except ValueError:
                raise ConfigError([f"{arg}: give a number, e.g. steps=200 or minutes=10"]) from None
            if budget[key] <= 0:
                raise ConfigError([f"{arg}: the budget must be positive"])
        else:
            rest.append(arg)
    if not budget:
        raise ConfigError(["give a budget: steps=N (optimizer steps) and/or minutes=M (training time)"])
    return budget, rest


def _train_losses(run_dir: Path) -> list[tuple[int, float]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    events = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [(e["step"], e["loss"]) for e in events if e.get("event") == "train"]


def _score(x: float | None) -> str:
    return "not reported" if x is None else f"{x:.1f}"


def report(summary: dict[str, Any], cfg: DictConfig, recipe: DictConfig, budget: dict[str, float],
           experiment: str) -> tuple[str, dict[str, Any]]:
    """(markdown, json) of a budgeted run: its scores next to the published ones, the budget used."""
    # The papers give percent; the sequence-classification metrics here give fractions (Family.scores_in_percent).
    scale = 1.0 if family_for(cfg.task.family).scores_in_percent else 100.0
    rows = []
    extras = extra_split_names(cfg.task)
    for metric, published in cfg.published.scores.items():
        value = summary["eval"].get(metric)
        split, _, key = metric.rpartition("/")
        if value is None and split and len(extras) == 1:  # local files name the extra split by their stem
            value = summary["eval"].get(f"{extras[0]}/{key}")
        ours = None if value is None else value * scale
        rows.append(dict(metric=metric, run=ours, published=float(published),
                         gap=None if ours is None else ours - float(published)))
    used = {k: summary[k] for k in ("steps", "epochs", "train_seconds", "wall_seconds", "train_samples")}
    planned = recipe.trainer.max_steps
    share = summary["steps"] / planned if planned > 0 else summary["epochs"] / recipe.trainer.epochs
    trail = _train_losses(Path(summary["run_dir"]))
    data = dict(experiment=experiment, budget=budget, used=used, share_of_recipe=share, model=cfg.model.name,
                recipe_model=recipe.model.name, precision=summary["precision"], device=summary["device_name"],
                train_file=cfg.task.train_file, validation_file=cfg.task.validation_file,
                published=dict(source=cfg.published.source, split=cfg.published.split), scores=rows,
                run_dir=summary["run_dir"], train_losses=trail)
    losses = (f"{trail[0][1]:.4g} at step {trail[0][0]} -> {trail[-1][1]:.4g} at step {trail[-1][0]}" if trail
              else "none logged")
    asked = " and ".join(f"{v:g} {k}" for k, v in budget.items())
    lines = [
        f"# {experiment}: a budgeted run of the paper recipe",
        "",
        f"Budget: {asked}. Used: {used['steps']} optimizer steps, {used['epochs']:.3g} epochs "
        f"({100 * share:.2g}% of the recipe's {recipe.trainer.epochs:g} epochs), {used['train_samples']} training "
        f"examples, {used['train_seconds']:.0f} s of training, {used['wall_seconds']:.0f} s in all.",
        f"Model: {cfg.model.name} (the recipe's: {recipe.model.name}), precision {summary['precision']}, "
        f"on {summary['device_name']}. Data: {cfg.task.train_file or cfg.task.dataset} / "
        f"{cfg.task.validation_file or cfg.task.validation_split}.",
        "",
        f"Training loss (logged windows): {losses}; validation loss at the end: {summary['eval']['loss']:.4g}.",
        "",
        "| metric | this run | published | run - published |",
        "|---|---|---|---|",
        *(f"| {r['metric']} | {_score(r['run'])} | {r['published']:.1f} | {_score(r['gap'])} |" for r in rows),
        "",
        f"Published: {cfg.published.source}, on {cfg.published.split}; this run scores the data named above"
        + (f" and {', '.join(extras)}" if extras else "") + ".",
        "",
        f"**These are not the published numbers.** They need the recipe's full model ({recipe.model.name}), its "
        f"full training data and all {recipe.trainer.epochs:g} epochs"
        + (" (and the paper's own test server or test set)" if "test" in str(cfg.published.split) else "")
        + ". A budgeted run shows that the recipe runs end to end and is heading the right way: the loss falls "
        "and the score moves from chance towards the published one as the budget grows.",
        "",
    ]
    return "\n".join(lines), data


def main(argv: list[str]) -> None:
    budget, overrides = _budget(argv)
    runs = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")]
    overrides = [o for o in overrides if not o.startswith("hydra.run.dir=")]
    overrides += [f"trainer.max_{key}={value}" for key, value in budget.items()]  # max_steps, max_minutes
    cfg = compose(overrides, with_hydra=True)
    experiment = cfg.hydra.runtime.choices.get("experiment")
    if experiment is None:
        raise ConfigError(["name a paper recipe: experiment=<one of conf/experiment/, e.g. sst2-bert-base>"])
    recipe = compose([f"experiment={experiment}"])
    if not recipe.published.scores:
        raise ConfigError([f"experiment={experiment} has no published scores (its `published:` block) to compare "
                           "with; choose a paper recipe from conf/experiment/"])
    run_dir = Path(runs[-1] if runs else f"runs/reproduce/{experiment}/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
    proc = subprocess.run([sys.executable, "-m", "ampft.launch", *overrides, f"hydra.run.dir={run_dir}"])
    if proc.returncode != 0:
        raise SystemExit(proc.returncode)
    summary = json.loads((run_dir / "summary.json").read_text())
    text, data = report(summary, cfg, recipe, budget, experiment)
    (run_dir / "reproduce.md").write_text(text)
    (run_dir / "reproduce.json").write_text(json.dumps(data, indent=2) + "\n")
    print(text)
    print(f"-> {run_dir / 'reproduce.md'}")


if __name__ == "__main__":
    exit_on_error(main)(sys.argv[1:])

"""Seeds measured in separate runs → one report: `python -m ampft.benchmark.combine OUT RUN_DIR...`.

Reads each run's results.json (accuracy mode) and writes OUT's results.json, report.md and plots over all
their seeds, summarized as if they had run together (`results.resummarize`). It refuses, naming every reason,
what would not be one benchmark (docs/benchmarks/README.md, "seeds in pieces"): another setup or machine, an
arm defined otherwise or missing a seed, an (arm, seed) measured twice with different metrics (else the first
directory's run is kept).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ampft.benchmark.config import BenchmarkConfigError
from ampft.benchmark.report import write_outputs
from ampft.benchmark.results import resummarize
from ampft.errors import exit_on_error

# What makes two runs' timings comparable; the date, load and kernel release may differ.
MACHINE = ("device_type", "device_name", "device_memory_bytes", "compute_capability", "driver", "cuda", "cudnn", "cpu",
           "cpu_count", "cpu_features", "torch_threads", "python", "torch", "transformers", "accelerate")


def _setup(b: dict) -> dict:
    a = b["accuracy"]
    return dict(model=b["model"], task=b["task"], seq_len=b["seq_len"], batch_size=b["batch_size"],
                overrides=b["overrides"], extra=b.get("extra", []), accuracy_overrides=a["overrides"],
                isolate=a.get("isolate", False))


def combine(run_dirs: list[str | Path], out_dir: str | Path, command: str | None = None) -> Path:
    """Merge the accuracy runs saved in run_dirs (each with a results.json) into out_dir; return report.md.
    Raises BenchmarkConfigError naming every reason they cannot be one benchmark."""
    dirs = [Path(d) for d in run_dirs]
    if len(dirs) < 2:
        raise BenchmarkConfigError([f"combine needs two or more run directories, got {len(dirs)}"])
    olds, problems = [], []
    for d in dirs:
        try:
            old = json.loads((d / "results.json").read_text())
        except (OSError, ValueError) as exc:
            problems.append(f"{d}: no readable results.json ({exc}); give directories written by recipes/benchmark.py")
            continue
        if not (old.get("accuracy") or {}).get("runs"):
            problems.append(f"{d}: no accuracy runs; combine merges accuracy mode's seeds")
        olds.append(old)
    if problems:
        raise BenchmarkConfigError(problems)
    first = olds[0]
    arms: dict[str, tuple[dict, Path]] = {}  # name -> the arm, as the first directory that has it defines it
    runs: dict[tuple[str, int], dict] = {}
    for d, old in zip(dirs, olds, strict=True):  # the first directory, compared with itself, differs in nothing
        this, that = _setup(old["benchmark"]), _setup(first["benchmark"])
        if diff := [k for k in this if this[k] != that[k]]:
            problems.append(f"{d}: " + ", ".join(f"{k}={this[k]}" for k in diff) + f", {dirs[0]} has "
                            + ", ".join(f"{k}={that[k]}" for k in diff) + ": another setup")
        if diff := [k for k in MACHINE if old["environment"].get(k) != first["environment"].get(k)]:
            problems.append(f"{d}: measured on another machine or software than {dirs[0]} ("
                            + ", ".join(f"{k} {old['environment'].get(k)} vs {first['environment'].get(k)}"
                                        for k in diff) + "): their speeds cannot be one median")
        for arm in old["benchmark"]["arms"]:
            known, where = arms.setdefault(arm["name"], (arm, d))
            if (known.get("runner"), known["overrides"]) != (arm.get("runner"), arm["overrides"]):
                problems.append(f"arm {arm['name']}: {known.get('runner')} {known['overrides']} in {where}, "
                                f"{arm.get('runner')} {arm['overrides']} in {d}: rename one")
        for r in old["accuracy"]["runs"]:
            key = (r["arm"], r["seed"])
            if key not in runs:
                runs[key] = dict(r, source=str(d))
            elif runs[key]["eval"] != r["eval"]:
                problems.append(f"arm {r['arm']} seed {r['seed']}: {runs[key]['eval']} in {runs[key]['source']}, "
                                f"{r['eval']} in {d}: the same run gave another result (other code or data?)")
    seeds = sorted({s for _, s in runs})
    # the arms of accuracy mode (an arm with modes: [speed] has no runs to pair)
    measured = [n for n, (arm, _) in arms.items() if arm.get("modes") is None or "accuracy" in arm["modes"]]
    for name in measured:
        if missing := [s for s in seeds if (name, s) not in runs]:
            problems.append(f"arm {name} has no run for seed(s) {missing}: every arm needs every seed (the "
                            "differences are paired by seed); run them, or leave out the directories that add them")
    if problems:
        raise BenchmarkConfigError(problems)

    def union(lists) -> list:
        return list({json.dumps(x, sort_keys=True): x for xs in lists for x in xs}.values())

    b = dict(first["benchmark"], modes=["accuracy"], arms=[a for a, _ in arms.values()],
             targets=union(old["benchmark"]["targets"] for old in olds))
    b["accuracy"] = dict(b["accuracy"], seeds=seeds, reference=union(old["benchmark"]["accuracy"]["reference"]
                                                                      for old in olds))
    env = dict(first["environment"],
               date=", ".join(dict.fromkeys(old["environment"]["date"] for old in olds)),
               load_average=max((old["environment"].get("load_average") or 0.0) for old in olds))
    res = resummarize(dict(benchmark=b, environment=env, command=command, speed=None,
                           accuracy=dict(runs=[runs[(a, s)] for a in measured for s in seeds])))
    res["sources"] = [dict(dir=str(d), command=old["command"], arms=[a["name"] for a in old["benchmark"]["arms"]],
                           seeds=sorted({r["seed"] for r in old["accuracy"]["runs"]})) for d, old in zip(dirs, olds, strict=True)]
    return write_outputs(res, out_dir)


@exit_on_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ampft.benchmark.combine", description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", help="where results.json and report.md over all the seeds go")
    parser.add_argument("run_dirs", nargs="+", help="directories of recipes/benchmark.py runs (their results.json)")
    args = parser.parse_args(argv)
    command = " ".join(["python -m ampft.benchmark.combine", args.out_dir, *args.run_dirs])
    path = combine(args.run_dirs, args.out_dir, command)
    print(f"report: {path}", flush=True)
    print(path.read_text(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

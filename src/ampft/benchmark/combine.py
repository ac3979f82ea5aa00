"""Seeds measured in separate runs → one report: `python -m ampft.benchmark.combine OUT RUN_DIR...`.

A multi-seed comparison often runs in pieces (seed 1 today, seeds 2-3 tonight, a stopped run finished by
another). `combine` reads each run's results.json and writes OUT/results.json and OUT/report.md over all
their seeds, summarized exactly as if they had run together (`results.summarize`: medians for speed, means and
paired-by-seed differences for the metric). It refuses what would not be one comparison:

- another setup (the shared `overrides` and `extra`), or an arm of the same name with another runner or
  overrides;
- another machine or software (device, CPU model and flags, threads, torch/transformers/accelerate/Python):
  a median of samples/s over two machines means nothing;
- an arm missing a seed another arm has (the comparison is paired by seed);
- an (arm, seed) measured twice with different metrics (the runs are deterministic: another result means
  other code or data). Measured twice with the same metric, the first directory's run is kept.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from ampft.benchmark.config import BenchmarkConfigError, PeerConfig, check_peer
from ampft.benchmark.report import write_outputs
from ampft.benchmark.results import summarize_peer, upgrade_runs
from ampft.errors import exit_on_error

# What makes two runs' timings comparable; the date, load and kernel release may differ.
MACHINE = ("device_type", "device_name", "device_memory_bytes", "compute_capability", "driver", "cuda", "cudnn", "cpu",
           "cpu_count", "cpu_features", "torch_threads", "python", "torch", "transformers", "accelerate")
SETUP = ("overrides", "extra")


def combine(run_dirs: list[str | Path], out_dir: str | Path, command: str | None = None) -> Path:
    """Merge the peer runs saved in run_dirs (each with a results.json) into out_dir/results.json and
    out_dir/report.md; return report.md. Raises BenchmarkConfigError naming every reason they cannot be one
    comparison."""
    dirs = [Path(d) for d in run_dirs]
    if len(dirs) < 2:
        raise BenchmarkConfigError([f"combine needs two or more run directories, got {len(dirs)}"])
    olds, unreadable = [], []
    for d in dirs:
        try:
            olds.append(json.loads((d / "results.json").read_text()))
        except (OSError, ValueError) as exc:
            unreadable.append(f"{d}: no readable results.json ({exc}); give directories written by recipes/peer.py")
    if unreadable:
        raise BenchmarkConfigError(unreadable)
    first, problems = olds[0], []
    for d, old in zip(dirs[1:], olds[1:], strict=True):
        for key in SETUP:
            if old["config"][key] != first["config"][key]:
                problems.append(f"{d}: peer.{key}={old['config'][key]}, {dirs[0]} has {first['config'][key]}: "
                                "another setup")
        if diff := [k for k in MACHINE if old["environment"].get(k) != first["environment"].get(k)]:
            problems.append(f"{d}: measured on another machine or software than {dirs[0]} ("
                            + ", ".join(f"{k} {old['environment'].get(k)} vs {first['environment'].get(k)}"
                                        for k in diff) + "): their speeds cannot be one median")
    arms: dict[str, dict] = {}  # name -> the arm, as the first directory that has it defines it
    defined_in: dict[str, Path] = {}
    for d, old in zip(dirs, olds, strict=True):
        for arm in old["config"]["arms"]:
            known = arms.setdefault(arm["name"], arm)
            where = defined_in.setdefault(arm["name"], d)
            if (known["runner"], known["overrides"]) != (arm["runner"], arm["overrides"]):
                problems.append(f"arm {arm['name']}: {known['runner']} {known['overrides']} in {where}, "
                                f"{arm['runner']} {arm['overrides']} in {d}: rename one")
    runs: dict[tuple[str, int], dict] = {}
    for d, old in zip(dirs, olds, strict=True):
        for r in upgrade_runs(old["runs"]):
            key = (r["arm"], r["seed"])
            if key not in runs:
                runs[key] = dict(r, source=str(d))
            elif runs[key]["eval"] != r["eval"]:
                problems.append(f"arm {r['arm']} seed {r['seed']}: {runs[key]['eval']} in {runs[key]['source']}, "
                                f"{r['eval']} in {d}: the same run gave another result (other code or data?)")
    seeds = sorted({s for _, s in runs})
    for name in arms:
        if missing := [s for s in seeds if (name, s) not in runs]:
            problems.append(f"arm {name} has no run for seed(s) {missing}: every arm needs every seed (the "
                            "comparison is paired by seed); run them, or leave out the directories that add them")
    if problems:
        raise BenchmarkConfigError(problems)

    def union(key: str) -> list:
        return list({json.dumps(x, sort_keys=True): x for old in olds for x in old["config"][key]}.values())

    p = OmegaConf.merge(OmegaConf.structured(PeerConfig), first["config"], {
        "seeds": seeds, "targets": union("targets"), "accuracy_reference": union("accuracy_reference"),
        "arms": list(arms.values())})
    ordered = [runs[(a, s)] for s in seeds for a in arms]
    env = dict(first["environment"],
               date=", ".join(dict.fromkeys(old["environment"]["date"] for old in olds)),
               load_average=max((old["environment"].get("load_average") or 0.0) for old in olds))
    results = summarize_peer(p, check_peer(p), ordered, env, command)
    results["seeds_requested"] = seeds
    results["sources"] = [dict(dir=str(d), command=old["command"], seeds=old["setup"]["seeds"],
                               arms=[a["name"] for a in old["config"]["arms"]]) for d, old in zip(dirs, olds, strict=True)]
    return write_outputs(results, out_dir)


@exit_on_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ampft.benchmark.combine", description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", help="where results.json and report.md over all the seeds go")
    parser.add_argument("run_dirs", nargs="+", help="directories of recipes/peer.py runs (their results.json)")
    args = parser.parse_args(argv)
    command = " ".join(["python -m ampft.benchmark.combine", args.out_dir, *args.run_dirs])
    path = combine(args.run_dirs, args.out_dir, command)
    print(f"report: {path}", flush=True)
    print(path.read_text(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

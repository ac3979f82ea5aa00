"""ampft against the plain Hugging Face Trainer: `python recipes/peer.py [peer=NAME] [peer.key=value] ...`.

    python recipes/peer.py                              # peer=sst2-minilm: MiniLM-L6 on SST-2, CPU
    python recipes/peer.py 'peer.seeds=[1,2,3]'         # several seeds (accuracy as a mean)

Configs live in conf/peer/; each arm is a runner (trainer | ampft) and finetune overrides. The report
(report.md, results.json) goes to runs/benchmark-peer/<name>/<time>/.
"""

import sys
from pathlib import Path

# Run as a script, recipes/ is sys.path[0]: a recipe named like a library would shadow it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import ampft.benchmark.peer  # noqa: E402, F401  (registers the peer schema before composition)


@hydra.main(version_base="1.3", config_path="../conf", config_name="peer_recipe")
def main(cfg: DictConfig) -> None:
    from ampft.benchmark import BenchmarkConfigError
    from ampft.benchmark.peer import run_peer
    from ampft.data import DataError
    from ampft.models import ModelLoadError

    overrides = " ".join(HydraConfig.get().overrides.task)
    command = f"python recipes/peer.py {overrides}".strip()
    try:
        path = run_peer(cfg.peer, HydraConfig.get().runtime.output_dir, command=command)
    except (BenchmarkConfigError, DataError, ModelLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(f"report: {path}", flush=True)
    print(Path(path).read_text(), flush=True)


if __name__ == "__main__":
    main()

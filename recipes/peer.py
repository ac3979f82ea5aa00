"""ampft against the plain Hugging Face Trainer: `python recipes/peer.py [peer=NAME] [peer.key=value] ...`.

    python recipes/peer.py                              # peer=sst2-minilm: MiniLM-L6 on SST-2, CPU
    python recipes/peer.py 'peer.seeds=[1,2,3]'         # several seeds (accuracy as a mean)

Configs live in conf/peer/; each arm is a runner (trainer | ampft) and finetune overrides. The report
(report.md, results.json) goes to runs/benchmark-peer/<name>/<time>/.
"""

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ampft.benchmark.peer  # noqa: F401  (registers the peer schema before composition)
from ampft.errors import compose_errors, exit_on_error


@compose_errors
@hydra.main(version_base="1.3", config_path="../conf", config_name="peer_recipe")
@exit_on_error
def main(cfg: DictConfig) -> None:
    from ampft.benchmark.peer import run_peer

    overrides = " ".join(HydraConfig.get().overrides.task)
    command = f"python recipes/peer.py {overrides}".strip()
    path = run_peer(cfg.peer, HydraConfig.get().runtime.output_dir, command=command)
    print(f"report: {path}", flush=True)
    print(Path(path).read_text(), flush=True)


if __name__ == "__main__":
    main()

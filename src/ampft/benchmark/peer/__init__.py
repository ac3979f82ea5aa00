"""ampft against the plain Hugging Face Trainer: same model, data, hyper-parameters and precision.

`make benchmark-peer` (recipes/peer.py, conf/peer/*.yaml) runs each arm in a fresh Python process, one
after the other, and writes results.json and report.md. The same split as the precision benchmark:

- `config`: the schema (`PeerConfig`, registered as `peer_recipe` on import) and `check`;
- `arms`: one arm in its own process, a `trainer` arm (a run_glue-style `transformers.Trainer` script)
  or an `ampft` arm (`ampft.finetune.run` with the arm's finetune overrides, e.g. one fast path off);
- `runner`: `run_peer`, the orchestrator, and the parent's side of the subprocess protocol;
- `results`: per-arm statistics over seeds, speed ratios, targets and accuracy checks, and each side's
  gain from bf16 over its fp32 twin (`precision_pairs`);
- `report`: report.md (tables as in `ampft.benchmark.report`);
- `combine`: the seeds of several saved runs of one setup as one report
  (`python -m ampft.benchmark.peer.combine OUT RUN_DIR...`).

Per arm: training samples/s and non-padding tokens/s (over the training loop alone), the process's wall
time (interpreter start to exit: imports, model, tokenization, training, evaluation), the evaluation
metric, peak RSS (CPU) or CUDA peak, and model FLOP/s over non-padding tokens (`ampft.benchmark.flops`;
MFU where the device's peak is known). Each ampft arm starts with an empty tokenization cache, so both pay
for tokenizing.
"""

from ampft.benchmark.peer.config import PeerConfig, Runner, check
from ampft.benchmark.peer.runner import rerender, run_peer

__all__ = ["PeerConfig", "Runner", "check", "rerender", "run_peer"]

"""Run recipes/finetune.py with an fp16 overflow in the gradient shard of ONE rank (tests/distributed).

    accelerate launch ... tests/distributed/overflow_on_one_rank.py RANK:ATTEMPT [overrides ...]

At the ATTEMPT-th optimizer step (counting from 1), rank RANK's local gradient shard gets an inf just before
the loss scaler unscales it: under FSDP each rank checks only its own shard, which is how a real overflow in
one part of the model looks. Every rank must skip that step, or the shards of one model drift apart.
"""

import os
import runpy
import sys

import torch

rank, attempt = map(int, sys.argv[1].split(":"))
sys.argv = ["recipes/finetune.py", *sys.argv[2:]]
calls = {"n": 0}
real_unscale = torch.amp.GradScaler.unscale_


def unscale_(self, optimizer):
    calls["n"] += 1
    if calls["n"] == attempt and int(os.environ.get("RANK", "0")) == rank:
        for group in optimizer.param_groups:
            for p in group["params"]:
                local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                if local is not None and local.numel():
                    local.view(-1)[0] = float("inf")
                    return real_unscale(self, optimizer)
    return real_unscale(self, optimizer)


torch.amp.GradScaler.unscale_ = unscale_
runpy.run_path("recipes/finetune.py", run_name="__main__")

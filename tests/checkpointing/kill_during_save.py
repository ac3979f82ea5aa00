"""Run recipes/finetune.py and SIGKILL it at a chosen point inside a checkpoint save (tests/checkpointing).

    python tests/checkpointing/kill_during_save.py POINT:TARGET [overrides ...]

file:step_4.tmp/optimizer.bin    inside accelerator.save_state, right after that file was written
renaming:step_6.tmp              complete and fsynced with its manifest, not yet renamed to step_6
deleting:step_2                  rotation deleting step_2: renamed aside, one file already removed
step:6                           right after training step 6 is logged (between saves)
"""

import os
import runpy
import signal
import sys
from pathlib import Path

import accelerate.checkpointing as accelerate_checkpointing

import ampft.checkpointing as ck

point, target = sys.argv[1].split(":", 1)
sys.argv = ["recipes/finetune.py", *sys.argv[2:]]


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


if point == "file":
    real_save = accelerate_checkpointing.save

    def save(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        if str(f).endswith(target):
            die()

    accelerate_checkpointing.save = save
elif point == "renaming":
    import ampft.files as files

    real_fsync = files.fsync_dir

    def fsync_dir(path):
        real_fsync(path)
        if Path(path).name == target:
            die()

    files.fsync_dir = fsync_dir  # the manifest's write (files.write_atomic) fsyncs the folder last
elif point == "deleting":
    real_remove = ck._remove

    def remove(path):
        if path.name == target:
            aside = path.with_name(path.name + ".deleting")
            path.rename(aside)
            (aside / "model.safetensors").unlink()
            die()
        real_remove(path)

    ck._remove = remove
elif point == "step":
    import ampft.tracking as tracking

    real_log = tracking.Tracker.log

    def log(self, event, step, values):
        real_log(self, event, step, values)
        if event == "train" and step == int(target):
            die()

    tracking.Tracker.log = log
else:
    raise SystemExit(f"unknown point {point}")

runpy.run_path("recipes/finetune.py", run_name="__main__")

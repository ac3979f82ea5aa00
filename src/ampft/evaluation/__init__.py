"""The saved-run recipe bodies: `make evaluate` (`saved`) and `make predict` (`predictions`), above the task
families. The inference loop they and the families share is `ampft.tasks.base.gather`."""

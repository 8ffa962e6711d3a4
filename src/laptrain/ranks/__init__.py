"""The ranks of a run: how many processes its config starts and who starts them
(:mod:`laptrain.ranks.processes`: ``trainer.devices``, the strategy, the launcher, each rank's GPU,
the multi-process checks before Hydra), and which rank this process is, read from the launcher's
environment (:mod:`laptrain.ranks.environment`)."""

"""Experiment trackers beside TensorBoard and CSV: MLflow and W&B runs that follow laptrain's run
folder (docs/loggers.md). ``tracking`` is what the job calls; ``resume`` keeps one tracking run per
laptrain run; ``mlflow_logger`` is Lightning's MLFlowLogger with the one change a resume needs."""

"""lm-evaluation-harness tasks that ship with laptrain (``laptrain eval RUN --tasks stdlib_mc``):
each a folder of a task YAML and the data it reads, found offline through ``include_path``."""

from pathlib import Path

TASKS_DIR = Path(__file__).parent

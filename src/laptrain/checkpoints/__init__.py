"""Checkpoint files: atomic writes, reading one back safely, and the checks before a resume."""

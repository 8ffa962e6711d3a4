"""LightningModules, one file per model family."""

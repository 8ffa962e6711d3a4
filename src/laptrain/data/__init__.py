"""LightningDataModules, samplers and collators."""

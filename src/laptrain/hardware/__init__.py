"""The machine: device probe, profile resolution, environment, preflight."""

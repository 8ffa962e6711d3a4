"""One training job after launch: its plan (device, precision, batch, workers, preflight) and its
story in ``run`` (build, fit, test, export, report)."""

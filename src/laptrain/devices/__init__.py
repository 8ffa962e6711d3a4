"""Run each model family on this machine's device: the smoke test, and the checks it makes.

- :mod:`laptrain.devices.families`: each registry family's smoke build (``laptrain/model/<family>/
  smoke.py``), with the registry's precision rule.
- :mod:`laptrain.devices.placement`: every tensor a module or callback keeps must sit on the
  parameters' device, in a dtype consistent with theirs.
- :mod:`laptrain.devices.smoke`: a few steps, save, resume and predict per family and precision,
  as a markdown table (``python benchmarks/device_smoke.py``).
"""

"""The device smoke harness: each model family a few steps on this machine's device, at every
precision, and the checks each cell makes (``python benchmarks/device_smoke.py``; nothing in the
package imports it, the benchmark and the tests do).

- :mod:`laptrain.device_smoke.builds`: each installed family's smoke build (its ``FAMILY.smoke``,
  ``laptrain/families/<family>/smoke.py``), with its precision rule.
- :mod:`laptrain.device_smoke.placement`: every tensor a module or callback keeps must sit on the
  parameters' device, in a dtype consistent with theirs.
- :mod:`laptrain.device_smoke.cells`: a few steps, save, resume and predict per family and
  precision, as a markdown table.
"""

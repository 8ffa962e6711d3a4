"""The device smoke harness: each model family a few steps on this machine's device, at every
precision, and the checks each cell makes (``python benchmarks/device_smoke.py``; nothing in
``src/laptrain`` imports it, the benchmark and the tests do).

- :mod:`smoke_harness.builds`: each installed family's smoke build (its ``FAMILY.smoke``,
  ``laptrain/families/<family>/smoke.py``), with its precision rule.
- :mod:`smoke_harness.placement`: every tensor a module or callback keeps must sit on the
  parameters' device, in a dtype consistent with theirs.
- :mod:`smoke_harness.cells`: a few steps, save, resume and predict per family and
  precision, as a markdown table.
"""

"""The machine: detection, the device probe, profiles and their precision rules, ``hardware=auto``,
the environment exported before torch, power and thermal readings. No torch at module level."""

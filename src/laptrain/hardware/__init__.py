"""The machine: detection (``detect``), the device probe (``probe``), profiles and their precision
rules (``profile``), ``hardware=auto`` (``auto``), the environment exported before torch (``env``),
power and thermal readings (``power``, ``thermal``). No torch import at module level: the launch
reads profiles before the environment is exported."""

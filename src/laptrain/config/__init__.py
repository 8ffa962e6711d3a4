"""What the command line and the composed config say, checked before torch is imported: Hydra
overrides on argv, the batch request, the process layout a strategy implies, each ``_target_``
against its constructor, the extras a plugin needs, and the config tree printed at start."""

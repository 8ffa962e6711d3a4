"""Everything that happens before Hydra's ``main`` runs the job, in this order: ``hardware=auto`` and
argv hooks resolved, the config composed, the data files checked, the profile's environment
exported (before torch is imported: torch reads several variables once), every ``_target_``
checked, the device and precision decided (``device``: a typed value the job is handed), the run
folder locked. ``prepare`` is the one sequence ``train.py`` and ``laptrain bench`` share."""

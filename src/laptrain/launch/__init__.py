"""Everything before Hydra's ``main`` runs the job: argv resolved, the config composed and checked,
the data files checked, the profile's environment exported before torch, the device decided,
the run folder locked. ``prepare`` is the sequence ``train.py`` and ``laptrain bench`` share."""

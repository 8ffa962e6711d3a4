"""What any LightningModule may use, a family's or a user's (the families themselves are wings in
``laptrain/families/``): ``contracts.py``
(what the run may ask of a module), ``checkpointing.py`` (``gradient_checkpointing: auto``),
``chunked_backward.py`` (the out-of-memory backoff), ``fsdp_units.py`` (the FSDP units of
``trainer=fsdp``) and ``doctor_check.py`` (what a family's ``laptrain doctor`` check returns).
docs/model_families.md walks through adding a family."""

"""The model families: ``families.py`` is the registry every other floor asks (precision rules,
FSDP units, the smoke build and each family's hooks), each family has its own package
(``classifier/``, ``lora/``, ``trm/``), and the pieces they share sit beside it: ``contracts.py``
(what the run may ask of a module), ``checkpointing.py`` (``gradient_checkpointing: auto``),
``chunked_backward.py`` (the out-of-memory backoff), ``fsdp_units.py`` (the FSDP units of
``trainer=fsdp``) and ``doctor_check.py`` (what a family's ``laptrain doctor`` check returns).
docs/model_families.md walks through adding a family."""

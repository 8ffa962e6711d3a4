"""What any LightningModule may use, a family's or a user's: ``contracts``,
``gradient_checkpointing``, ``chunked_backward`` (the OOM backoff), ``fsdp_units`` and
``doctor_check`` (docs/model_families.md)."""

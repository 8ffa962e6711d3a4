"""laptrain's own model families, one wing each: ``classifier/``, ``lora/`` (with DPO and the GGUF
export) and ``trm/``. A wing holds its module, data, sizing, commands, checks and exports, and
declares them in its ``__init__.py`` as ``FAMILY`` (:class:`laptrain.family.Family`), the same
contract a user's ``user/<task>/__init__.py`` uses. A wing may import any engine package; no engine
module imports a wing (tests/test_floor_plan.py). ``smoke_data`` is what the wings' smoke builds
share."""

"""The ``laptrain`` command line and what its sub-commands do: ``doctor``, ``bench``, ``fetch``,
``predict``, ``preflight``, ``runs``, and the LoRA tools."""

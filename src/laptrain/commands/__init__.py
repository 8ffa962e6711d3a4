"""The ``laptrain`` command line and what its sub-commands do: ``doctor``, ``bench``, ``fetch``,
``predict``, ``preflight``, ``runs`` (list, ``compare``, ``clean``), ``why``, and the LoRA tools
(``lora_tools.py``)."""

"""The ``laptrain`` command line and what its sub-commands do: ``doctor``, ``bench``, ``fetch``,
``predict``, ``preflight``, ``runs`` (list, ``compare``, ``clean``), ``why``, and the LoRA tools
(``lora_cli.py``, their arguments; ``lora_tools.py``, their work). ``predict.py`` and
``lora_cli.py`` are the classifier's and the LoRA family's own commands: their registry entries
name them (``tools``), and ``cli.py`` adds what they declare."""

"""The ``laptrain`` command line and what its own sub-commands do: ``doctor``, ``bench``,
``fetch``, ``preflight``, ``runs`` (list, ``compare``, ``clean``), ``why``, ``new``. A family's
own commands (the classifier's ``predict``, LoRA's ``export``/``generate``/``eval``) live in its
wing, and ``cli.py`` adds what its ``FAMILY.commands`` declares."""

"""The ``laptrain`` command line and its own sub-commands; a family's own commands live in its wing
and reach ``cli.py`` through ``FAMILY.commands``."""

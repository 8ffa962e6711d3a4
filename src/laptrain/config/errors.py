"""The error a config that cannot run raises: here, below everything that raises it, so that
rooms the config check calls (the tracking loggers' mode check) need not import the check."""

from __future__ import annotations


class ConfigError(ValueError):
    """The config cannot run; the message is one line naming each key and its fix."""

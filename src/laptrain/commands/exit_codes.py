"""The exit code of a one-line ``error:``: one rule for ``train.py`` and every ``laptrain`` command.

The codes are :mod:`laptrain.job.run`'s (docs/lightning.md, "Interrupts and exit codes"): a job
that does not fit memory (:class:`laptrain.preflight.batch.PreflightError`, which the LoRA tools'
``BaseTooLarge`` is too) exits ``DOES_NOT_FIT_EXIT``, a NaN stop
(:class:`laptrain.callbacks.nonfinite_guard.NonFiniteLoss`) ``NONFINITE_EXIT``, anything else (bad
input) 2. A class whose module was never imported cannot have been raised, so telling them apart
imports nothing: a bad argument stays a fast, torch-free exit.
"""

from __future__ import annotations

import sys

BAD_INPUT = 2  # argparse's and Python's own code for a usage error


def error_exit_code(err: BaseException) -> int:
    """``DOES_NOT_FIT_EXIT``, ``NONFINITE_EXIT`` or 2 (bad input) for the error ``err``."""
    fits = sys.modules.get("laptrain.preflight.batch")
    guard = sys.modules.get("laptrain.callbacks.nonfinite_guard")
    if fits is not None and isinstance(err, fits.PreflightError):
        from laptrain.job.run import DOES_NOT_FIT_EXIT

        return DOES_NOT_FIT_EXIT
    if guard is not None and isinstance(err, guard.NonFiniteLoss):
        from laptrain.job.run import NONFINITE_EXIT

        return NONFINITE_EXIT
    return BAD_INPUT

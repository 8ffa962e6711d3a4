"""Every exit code laptrain gives (docs/lightning.md, "Interrupts and exit codes"): 0 a finished
run, 128 + a signal's number a run that signal stopped, and the codes below. :func:`error_exit_code`
tells a one-line ``error:`` apart by its class (``PreflightError``: ``DOES_NOT_FIT_EXIT``;
``NonFiniteLoss``: ``NONFINITE_EXIT``; else ``BAD_INPUT``) without importing anything: a class
whose module was never imported cannot have been raised.
"""

from __future__ import annotations

import sys

BAD_INPUT = 2  # argparse's and Python's own code for a usage error
# A run a callback paused on purpose (session budget, swap, battery) and that the same command
# resumes: sysexits.h's EX_TEMPFAIL ("a temporary failure; the user is invited to retry"), so a
# script or scheduler can tell it from a finished run (0) and from a signal (128 + its number).
PAUSED_EXIT = 75
# The job does not fit this machine's memory (the preflight's refusal; laptrain preflight, bench,
# doctor, export/generate/eval alike): sysexits.h's EX_UNAVAILABLE, "a service is unavailable":
# the command is right, the memory it needs is not there; a larger budget or a smaller job fits.
DOES_NOT_FIT_EXIT = 69
# The NaN guard stopped the run (callbacks.nonfinite_guard.action=stop): sysexits.h's EX_DATAERR,
# "the input data was incorrect": the same command stops again; the data, learning rate or
# precision must change (bad input stays 2, Python's and argparse's code for a usage error).
NONFINITE_EXIT = 65
# An Optuna sweep's pruner stopped the trial (hydra.sweeper.pruner): sysexits.h's EX_CONFIG, "something
# was found in an unconfigured or misconfigured state": these hyperparameters are not worth finishing.
# Inside the sweep the job raises optuna.TrialPruned instead (train.py), which the sweeper records.
PRUNED_EXIT = 78


def error_exit_code(err: BaseException) -> int:
    """``DOES_NOT_FIT_EXIT``, ``NONFINITE_EXIT`` or 2 (bad input) for the error ``err``."""
    fits = sys.modules.get("laptrain.preflight.batch")
    guard = sys.modules.get("laptrain.callbacks.nonfinite_guard")
    if fits is not None and isinstance(err, fits.PreflightError):
        return DOES_NOT_FIT_EXIT
    if guard is not None and isinstance(err, guard.NonFiniteLoss):
        return NONFINITE_EXIT
    return BAD_INPUT

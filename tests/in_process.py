"""`python train.py <args>` inside the test process, for end-to-end cases where a new process is not
the point (the suite's time: each subprocess pays ~5 s of imports on 2 cores).

``train_here`` runs the file itself (``runpy``), so argv resolution, the launch checks, Hydra's
entry, the job and the exit codes are the ones a user meets; what a process would have dropped on
exit is put back afterwards: the environment, the working folder, argv, signal handlers, logging,
torch's threads and RNGs, run-folder locks, and the modules imported from the run's folder (a user
project's ``user`` package differs from test to test).

Stay with :func:`tests.conftest.run_train` (a real process) where that is the point: signals sent
from outside, several processes (DDP, torchrun), environment variables torch reads at import, and
the installed command's own behaviour.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import random
import runpy
import signal
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch

from laptrain.run_folder import lock, naming

TRAIN = Path(__file__).resolve().parents[1] / "train.py"
PREFIX = Path(sys.prefix).resolve()  # the environment's packages are never the run's own
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2]


class _Restore(contextlib.ExitStack):
    """Everything a finished process would have taken with it, put back on exit."""

    def __init__(self, cwd: Path) -> None:
        super().__init__()
        self.cwd = cwd

    def __enter__(self) -> _Restore:
        super().__enter__()
        environ, here = dict(os.environ), os.getcwd()
        argv_list, path_list = sys.argv, sys.path  # train.py rebinds sys.argv: keep the objects
        argv, path = list(sys.argv), list(sys.path)
        modules = set(sys.modules)
        tops = {m.partition(".")[0] for m in modules}
        handlers = {s: signal.getsignal(s) for s in SIGNALS}
        loggers = _logger_states()
        threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
        deterministic = torch.are_deterministic_algorithms_enabled()
        matmul = torch.get_float32_matmul_precision()
        rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        held = set(lock._held)
        chosen = dict(naming._chosen)
        naming._chosen.clear()  # a process chooses its run folder afresh

        def restore() -> None:
            for key in set(lock._held) - held:
                lock.release_run_folder(key)
            naming._chosen.clear()
            naming._chosen.update(chosen)
            os.environ.clear()
            os.environ.update(environ)
            os.chdir(here)
            sys.argv, sys.path = argv_list, path_list
            sys.argv[:], sys.path[:] = argv, path
            for name in set(sys.modules) - modules:
                if name.partition(".")[0] == "user" or self._from_run(name, tops):
                    del sys.modules[name]
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            _put_back_loggers(loggers)
            torch.set_num_threads(threads)
            torch.set_default_dtype(dtype)
            torch.use_deterministic_algorithms(deterministic)
            torch.set_float32_matmul_precision(matmul)
            random.setstate(rng[0])
            np.random.set_state(rng[1])
            torch.set_rng_state(rng[2])

        self.callback(restore)
        self.enter_context(warnings.catch_warnings())
        _warn_like_a_fresh_process()
        return self

    def _from_run(self, name: str, tops: set[str]) -> bool:
        """Whether module ``name`` came from the run's folder (a user project written there): a
        package new to this process (not torch, laptrain or tests) whose file is under it."""
        if name.partition(".")[0] in tops:
            return False
        file = getattr(sys.modules[name], "__file__", None)
        if not file:
            return False
        where = Path(file).resolve()
        return where.is_relative_to(self.cwd) and not where.is_relative_to(PREFIX)


def _logger_states() -> dict[str, tuple]:
    """Each logger's level, handlers, propagation and on/off (Hydra's dictConfig and the job's
    quiet-library levels change them)."""
    names = [""] + list(logging.root.manager.loggerDict)
    states = {}
    for name in names:
        log = logging.getLogger(name)
        states[name] = (log.level, list(log.handlers), log.propagate, log.disabled)
    return states


def _put_back_loggers(states: dict[str, tuple]) -> None:
    """Loggers that existed before the run as they were; a library's logger first made during the
    run (its import) stays as the import set it, as it would in the next process."""
    for name, (level, handlers, propagate, disabled) in states.items():
        log = logging.getLogger(name)
        for handler in set(log.handlers) - set(handlers):
            handler.close()
        log.handlers[:] = handlers
        log.setLevel(level)
        log.propagate, log.disabled = propagate, disabled


def _show_on_stderr(message: warnings.WarningMessage) -> None:
    sys.stderr.write(
        warnings.formatwarning(
            message.message, message.category, message.filename, message.lineno, message.line
        )
    )


def _warn_like_a_fresh_process() -> None:
    """Warnings print to stderr under Python's default filters, as in ``python train.py``, not
    into pytest's record (a test asserting a warning is absent would otherwise pass unseen)."""
    warnings.resetwarnings()
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.filterwarnings("ignore", category=category, append=True)
    warnings.showwarning = warnings._showwarning_orig
    warnings._showwarnmsg_impl = _show_on_stderr


def train_here(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, script: Path = TRAIN
) -> subprocess.CompletedProcess:
    """`python train.py <args>` run in this process from ``cwd``; returns what
    :func:`tests.conftest.run_train` returns (exit code, stdout, stderr). ``script``: another
    copy of train.py (a user's clone), whose folder goes first on sys.path as Python puts it."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with _Restore(Path(cwd).resolve()):
        os.environ.update({"LAPTRAIN_CACHE": str(Path(cwd) / "cache"), **(env or {})})
        # a process puts PYTHONPATH's folders first on sys.path when it starts
        extra = [p for p in (env or {}).get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:0] = [str(Path(script).parent), *extra]
        os.chdir(cwd)
        sys.argv[:] = [str(script), *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
                if isinstance(stop.code, str):
                    print(stop.code, file=sys.stderr)
            except BaseException:  # an uncaught error: Python prints it and exits 1
                traceback.print_exc()
                code = 1
    return subprocess.CompletedProcess([str(script), *args], code, out.getvalue(), err.getvalue())

"""`python train.py <args>` (or another script or ``-m`` module) as a process of its own, forked
from a server that has imported torch, Lightning and laptrain already (the standard library's
``multiprocessing`` forkserver).

The run is a separate process, as a user's is: its exit code, its output, its signal handlers, its
module state and its ``atexit`` handlers are its own, and nothing it does reaches the test's
process. Only the imports are not paid again (about 5 s a run on 2 cores). What a process reads at
interpreter start or when torch is imported cannot differ from the server's, so
:func:`can_fork` sends a run whose environment changes such a variable to a fresh interpreter.
"""

from __future__ import annotations

import atexit
import functools
import json
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import lightning.pytorch  # noqa: F401  what train.py's job imports: the server holds them
import torch  # noqa: F401

import laptrain
import laptrain.job.run  # noqa: F401

# Read at interpreter start, at torch's import or by the C libraries it loads.
AT_START = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "MALLOC_", "LD_", "PYTORCH_",
            "TORCH_", "CUDA_", "NCCL_")  # fmt: skip
AT_START_FILES = ("sitecustomize.py", "usercustomize.py")  # run by the site module at start
_context: multiprocessing.context.ForkServerContext | None = None


def can_fork(env: dict[str, str]) -> bool:
    """Whether a run in ``env`` behaves as a fresh interpreter would when forked from the server:
    the same variables read at start, except ``PYTHONPATH`` (set as ``sys.path`` in the fork) when
    no folder on it holds another laptrain than the one the server imported or a file the site
    module runs at start."""
    keys = {k for k in {*env, *os.environ} if k.startswith(AT_START) and k != "PYTHONPATH"}
    if any(env.get(k) != os.environ.get(k) for k in keys):
        return False
    loaded = Path(laptrain.__file__).resolve().parent
    for entry in filter(None, env.get("PYTHONPATH", "").split(os.pathsep)):
        found = Path(entry) / "laptrain"
        if found.is_dir() and found.resolve() != loaded:
            return False
        if any((Path(entry) / name).exists() for name in AT_START_FILES):
            return False
    return True


@functools.cache
def _interpreter_path(pythonpath: str | None) -> list[str]:
    """``sys.path`` of a fresh interpreter with this ``PYTHONPATH``, after its script folder."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    code = "import json, sys; print(json.dumps(sys.path[1:]))"
    found = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return json.loads(found.stdout)


def _server() -> multiprocessing.context.ForkServerContext:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload([__name__])
    return _context


def _exit_code(code: object) -> int:
    """What the interpreter exits with for ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _run(
    command: list[str], cwd: str, env: dict[str, str], path: list[str], out: str, err: str
) -> None:
    """The forked process: the working folder, environment, argv, ``sys.path`` and output files
    of ``python <command>``, then the script or module as ``__main__``, then the atexit handlers."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, name in ((1, out), (2, err)):  # the fds: handlers made at import write there too
        opened = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(opened, fd)
        os.close(opened)
    module = command[1] if command[0] == "-m" else None
    sys.argv = command[1:] if module else list(command)
    sys.path[:] = [cwd if module else str(Path(command[0]).resolve().parent), *path]
    code = 0
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(command[0], run_name="__main__")
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException:  # what the interpreter prints and exits 1 with
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_python(
    command: list[str],
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: int = 240,
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """``subprocess.run([python, *command], cwd=cwd, env=env, capture_output=True, text=True)``:
    ``command`` is a script and its arguments, or ``-m module ...``; forked from the server when
    :func:`can_fork` allows, else (and with ``fresh``) a fresh interpreter."""
    env = dict(os.environ if env is None else env)
    argv = [sys.executable, *command]
    if fresh or not can_fork(env):
        return subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    with tempfile.TemporaryDirectory() as folder:
        out, err = os.path.join(folder, "out"), os.path.join(folder, "err")
        path = _interpreter_path(env.get("PYTHONPATH"))
        process = _server().Process(
            target=_run, args=(list(command), str(cwd), env, path, out, err)
        )
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(argv, timeout)
        stdout = Path(out).read_text(errors="replace") if os.path.exists(out) else ""
        stderr = Path(err).read_text(errors="replace") if os.path.exists(err) else ""
    return subprocess.CompletedProcess(argv, process.exitcode, stdout, stderr)

"""Asking a running job for a checkpoint from another terminal: the request file and its answer.
``laptrain checkpoint <run>`` (or ``touch <run>/checkpoint_now``) writes the request; the job's
``GracefulStop`` saves ``last.ckpt`` at the next exact-resume boundary, on every rank at the same
step, and answers in ``checkpoint_now.done`` (step, path, time). No torch: the CLI imports this."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from laptrain.checkpoints.last import run_last_checkpoint
from laptrain.console import relative
from laptrain.files import write_text_atomic
from laptrain.run_folder.listing import RUNS_ROOT, resolve_run
from laptrain.run_folder.lock import is_locked

REQUEST = "checkpoint_now"
ANSWER = "checkpoint_now.done"


def request_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / REQUEST


def answer_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / ANSWER


def answer(run_dir: str | Path, step: int, path: str | Path) -> None:
    """The job's side: record the checkpoint it wrote, then drop the request it answers."""
    record = {"step": step, "path": str(path), "time": time.time()}
    write_text_atomic(answer_file(run_dir), json.dumps(record) + "\n")
    request_file(run_dir).unlink(missing_ok=True)


def drop_stale_request(run_dir: str | Path) -> None:
    """Remove a request older than this process (made to an earlier one that died before it
    answered); a request made while this process was starting stays."""
    import psutil

    path = request_file(run_dir)
    try:
        if path.stat().st_mtime < psutil.Process().create_time():
            path.unlink(missing_ok=True)
    except OSError:
        pass


def read_answer(run_dir: str | Path) -> dict[str, Any] | None:
    try:
        record = json.loads(answer_file(run_dir).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def ask(run_dir: str | Path) -> float:
    """Write the request (replacing an earlier answer); returns the time it was made."""
    answer_file(run_dir).unlink(missing_ok=True)
    made = time.time()
    write_text_atomic(request_file(run_dir), json.dumps({"time": made}) + "\n")
    return made


def checkpoint_command(name: str, root: str | Path = RUNS_ROOT, wait_s: float = 120.0) -> int:
    """``laptrain checkpoint <run>``: ask the live run for a checkpoint and wait for its answer
    (exit codes: docs/cli.md; a request not answered in ``wait_s`` stays)."""
    try:
        run_dir = resolve_run(name, root)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not is_locked(run_dir):
        print(
            f"error: run {relative(run_dir)} is not running (no process holds its lock), so "
            f"there is nothing to checkpoint; its resume checkpoint is "
            f"{relative(run_last_checkpoint(run_dir))}",
            file=sys.stderr,
        )
        return 2
    ask(run_dir)
    if wait_s <= 0:
        print(f"asked {relative(run_dir)} for a checkpoint; it saves at its next step boundary")
        return 0
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        record = read_answer(run_dir)
        if record is not None:
            print(f"saved step {record.get('step')} to {relative(record.get('path', '?'))}")
            return 0
        if not is_locked(run_dir):
            request_file(run_dir).unlink(missing_ok=True)
            print(f"error: run {relative(run_dir)} ended before it saved", file=sys.stderr)
            return 1
        time.sleep(0.2)
    print(
        f"error: no checkpoint from {relative(run_dir)} after {wait_s:.0f} s: it looks at batch "
        "ends, so a long validation or step delays it (the request stays), and a run with "
        "callbacks.graceful_stop off never answers",
        file=sys.stderr,
    )
    return 1

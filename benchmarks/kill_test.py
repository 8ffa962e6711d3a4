"""Kill test: interrupt the tiny default job at random moments, rerun it, count what was lost.

Each round starts `python train.py` on a small generated data set (tiny classifier, checkpoint every
``--interval`` steps so that kills land during saves), sends SIGKILL, SIGINT (one Ctrl-C: the run
saves and goes on), a double SIGINT (0.05 s apart: the run stops) or SIGTERM at a seeded random
step, at a random moment inside it (a third of the SIGKILLs wait for a checkpoint's temporary file
to appear and kill during that write), then checks every checkpoint file in the run folder, reruns
the same command to the end and compares the final ``last.ckpt`` with an uninterrupted run's,
tensor by tensor. One run at a time (2 cores). Prints a markdown table.

``--setup workers`` trains with 2 persistent DataLoader workers and gradient accumulation 4;
``--setup ddp`` on 2 processes (``trainer=ddp_cpu trainer.strategy=ddp``, Lightning re-running the
command for rank 1). ``--group`` sends each signal to the run's whole process group (what Ctrl-C in
a terminal or ``kill -TERM -<pgid>`` does: workers and ranks get it too); DDP rounds always do,
since a SIGKILL of rank 0 alone would leave rank 1 waiting in its next collective.

    python benchmarks/kill_test.py --runs 50 [--seed 0] [--interval 5] [--setup workers] [--group]
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import lightning.pytorch as pl

ROOT = Path(__file__).resolve().parents[1]
SIGNALS = ("SIGKILL", "SIGINT", "SIGINT x2", "SIGTERM")
SECOND_SIGNAL_S = 0.05  # the tiny job makes a step every ~10 ms: 0.3 s would miss most runs
LABELS = {"SIGINT": "SIGINT once (saves, goes on)", "SIGINT x2": "SIGINT twice (stops)"}
SAVED_ON_CTRL_C = re.compile(r"Ctrl-C: saved step (\d+)")
TINY = [
    "model.backbone.hidden_size=32",
    "model.backbone.intermediate_size=64",
    "model.backbone.num_hidden_layers=1",
    "data.vocab_size=300",
]


class StepMarker(pl.Callback):
    """Writes the optimizer step reached after every batch (what a SIGKILL interrupted)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        Path(self.path).write_text(str(trainer.global_step))


def write_data(path: Path, rows: int = 400, seed: int = 0) -> Path:
    """Three labels whose words give them away, lengths 3-60 words (long-tailed)."""
    words = {
        "sports": "match goal team score player coach league season win ball",
        "cooking": "oven recipe salt butter flour bake simmer garlic pan dough",
        "weather": "rain cloud storm wind forecast sunny snow cold humid front",
    }
    filler = "the a of and to in is it"
    rng = random.Random(seed)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["text", "label"])
        for i in range(rows):
            label = list(words)[i % 3]
            n = min(60, 3 + int(rng.expovariate(1 / 12)))
            out.writerow(
                [" ".join(rng.choice(f"{words[label]} {filler}".split()) for _ in range(n)), label]
            )
    return path


@dataclass
class Round:
    signal: str
    during_save: bool
    exit_code: int = 0
    reached: int | None = None
    saved: int | None = None
    corrupt: int = 0
    identical: bool | None = None
    rerun_ok: bool = False
    notes: list[str] = field(default_factory=list)


def load_state(path: Path) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def same_weights(a: Path, b: Path) -> bool:
    import torch

    sa, sb = load_state(a)["state_dict"], load_state(b)["state_dict"]
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def corrupt_files(folder: Path) -> list[str]:
    from laptrain.checkpoints.checkpoint_io import read_checkpoint

    bad = []
    for path in sorted(folder.glob("*.ckpt")):
        try:
            read_checkpoint(path)
        except ValueError:
            bad.append(path.name)
    return bad


SETUPS = {
    "plain": [],
    "workers": [
        "hardware.num_workers=2",
        "hardware.persistent_workers=true",
        "trainer.accumulate_grad_batches=4",
    ],
    "ddp": ["trainer=ddp_cpu", "trainer.strategy=ddp"],
}


def command(work: Path, data: Path, run: str, interval: int, setup: str = "plain") -> list[str]:
    return [
        sys.executable,
        str(ROOT / "train.py"),
        "hardware=cpu",
        "model=tiny_classifier",
        "data=text_csv",
        *TINY,
        f"data.files.train={data}",
        "trainer.max_epochs=2",
        "trainer.deterministic=true",
        f"callbacks.periodic_checkpoint.every_n_train_steps={interval}",
        "test=false",
        *SETUPS[setup],
        f"run_name={run}",
        "+callbacks.step_marker._target_=kill_test.StepMarker",
        f"+callbacks.step_marker.path={work / (run + '.step')}",
    ]


def environment(work: Path) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "LAPTRAIN_CACHE": str(work / "cache")}


def run_to_end(cmd: list[str], work: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=work, env=environment(work), capture_output=True, text=True)


def interrupt(
    cmd: list[str],
    work: Path,
    rnd: Round,
    rng: random.Random,
    total_steps: int,
    step_s: float,
    group: bool = False,
) -> None:
    run_dir = work / "outputs" / cmd[-3].split("=", 1)[1]
    log = work / f"{run_dir.name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=work,
            env=environment(work),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=group,  # its own process group, which the signal then goes to
        )
    marker = work / (cmd[-3].split("=", 1)[1] + ".step")
    deadline = time.monotonic() + 180
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)  # training has started
    if rnd.during_save:
        ckpts = run_dir / "checkpoints"
        while proc.poll() is None and time.monotonic() < deadline:
            if any(ckpts.glob(".*.tmp")):
                break
            time.sleep(0.001)
    else:  # a random step of the run, then a random moment inside that step
        target = rng.randint(1, max(1, total_steps - 1))
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if int(marker.read_text() or 0) >= target:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.005)
        time.sleep(rng.uniform(0, step_s))
    at_signal = None
    if proc.poll() is None:
        name, _, twice = rnd.signal.partition(" ")
        signum = getattr(signal, name)
        at_signal = int(marker.read_text() or 0) if marker.exists() else 0
        for n in range(2 if twice else 1):
            # a second Ctrl-C well within the run's 5 s, and after the first one's handler ran
            # (two signals that arrive inside one C call, a backward say, count as one)
            time.sleep(SECOND_SIGNAL_S if n else 0)
            if group:
                os.killpg(proc.pid, signum)
            else:
                proc.send_signal(signum)
    else:
        rnd.notes.append("ended before the signal")
    try:
        rnd.exit_code = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:  # a hang: end the group, count the round as failed
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        rnd.exit_code = proc.wait()
        rnd.notes.append("hung for 300 s after the signal")
    if rnd.signal == "SIGINT":  # one Ctrl-C: saved at the next boundary, and the run went on
        saved = SAVED_ON_CTRL_C.search(log.read_text())
        if at_signal is not None and saved is None and rnd.exit_code == 0:
            rnd.notes.append("ended before the signal")
        elif saved is None:
            rnd.notes.append("no checkpoint after the Ctrl-C")
        rnd.reached = at_signal or 0
        rnd.saved = int(saved.group(1)) if saved else 0
        rnd.corrupt = len(corrupt_files(run_dir / "checkpoints"))
        return
    if rnd.exit_code == 0 and "ended before the signal" not in rnd.notes:
        rnd.notes.append("ended before the signal")  # it finished between the poll and the kill
    rnd.reached = int(marker.read_text() or 0) if marker.exists() else 0
    if rnd.reached >= total_steps and rnd.exit_code not in (0, 130, 143):
        rnd.notes.append("signal after training")  # ended by it during teardown, not a stop
    last = run_dir / "checkpoints" / "last.ckpt"
    rnd.corrupt = len(corrupt_files(run_dir / "checkpoints"))
    rnd.saved = load_state(last)["global_step"] if last.exists() and not rnd.corrupt else 0


def reference_run(cmd: list[str], work: Path) -> float:
    """The uninterrupted run; returns its training time (first step to the last step's marker),
    the window the random signals are sent in. The time after the last step (teardown, the
    second process of a DDP run exiting) is left out: a signal there would miss training."""
    marker = work / (cmd[-3].split("=", 1)[1] + ".step")
    log = work / "reference.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=work, env=environment(work), stdout=out, stderr=subprocess.STDOUT
        )
        started = last_change = None
        seen = ""
        while proc.poll() is None:
            try:
                text = marker.read_text()
            except OSError:
                text = ""
            if text and text != seen:
                seen, last_change = text, time.monotonic()
                started = started or last_change
            time.sleep(0.005)
    if proc.returncode != 0:
        raise SystemExit(f"the uninterrupted run failed:\n{log.read_text()[-3000:]}")
    return max(0.05, (last_change or time.monotonic()) - (started or time.monotonic()))


def main(argv: list[str] | None = None) -> list[Round]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interval", type=int, default=5, help="periodic checkpoint, in steps")
    parser.add_argument("--work", type=Path, default=None, help="folder to work in (temporary)")
    parser.add_argument("--setup", choices=sorted(SETUPS), default="plain")
    parser.add_argument("--group", action="store_true", help="signal the whole process group")
    args = parser.parse_args(argv)
    group = args.group or args.setup == "ddp"
    rng = random.Random(args.seed)
    work = args.work or Path(tempfile.mkdtemp(prefix="laptrain-kill-"))
    work.mkdir(parents=True, exist_ok=True)
    data = write_data(work / "texts.csv")

    span = reference_run(command(work, data, "reference", args.interval, args.setup), work)
    ref_last = work / "outputs" / "reference" / "checkpoints" / "last.ckpt"
    total_steps = int(load_state(ref_last)["global_step"])
    step_s = span / max(1, total_steps)

    rounds = []
    for i in range(args.runs):
        sig = SIGNALS[i % len(SIGNALS)] if args.runs >= len(SIGNALS) else rng.choice(SIGNALS)
        rnd = Round(sig, during_save=sig == "SIGKILL" and rng.random() < 1 / 3)
        cmd = command(work, data, f"r{i}", args.interval, args.setup)
        interrupt(cmd, work, rnd, rng, total_steps, step_s, group)
        done = run_to_end(cmd, work)
        if done.returncode != 0:
            rnd.notes.append(f"rerun exit {done.returncode}: {done.stderr.strip()[-200:]}")
        last = work / "outputs" / f"r{i}" / "checkpoints" / "last.ckpt"
        rnd.rerun_ok = done.returncode == 0
        rnd.identical = rnd.rerun_ok and same_weights(ref_last, last)
        rounds.append(rnd)
        print(
            f"round {i + 1}/{args.runs}: {sig}{' during a save' if rnd.during_save else ''}, "
            f"exit {rnd.exit_code}, reached step {rnd.reached}, checkpoint at {rnd.saved}, "
            f"corrupt {rnd.corrupt}, identical {rnd.identical} {' '.join(rnd.notes)}",
            flush=True,
        )
    print(table(rounds, args.interval, args.setup, group))
    return rounds


def _in_training(rnd: Round) -> bool:
    return not {"ended before the signal", "signal after training"} & set(rnd.notes)


def table(rounds: list[Round], interval: int, setup: str = "plain", group: bool = False) -> str:
    lines = [
        f"setup: {setup} ({' '.join(SETUPS[setup]) or 'no workers, one process'}); signals to "
        f"{'the process group' if group else 'the main process'}; interval between periodic "
        f"checkpoints: {interval} steps",
        "",
        "| signal | runs | signal arrived in training | exit codes | hangs | reruns completed "
        "| corrupt checkpoints | steps lost (max) | steps lost (mean) "
        "| final weights == uninterrupted |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for sig in SIGNALS:
        rs = [r for r in rounds if r.signal == sig]
        if not rs:
            continue
        lost = [max(0, (r.reached or 0) - (r.saved or 0)) for r in rs]
        during = sum(r.during_save for r in rs)
        name = LABELS.get(sig, sig) + (f" ({during} during a save)" if during else "")
        codes = ", ".join(str(c) for c in sorted({r.exit_code for r in rs}))
        lines.append(
            f"| {name} | {len(rs)} | {sum(_in_training(r) for r in rs)} | {codes} "
            f"| {sum(any(n.startswith('hung') for n in r.notes) for r in rs)} "
            f"| {sum(r.rerun_ok for r in rs)} "
            f"| {sum(r.corrupt for r in rs)} | {max(lost)} | {sum(lost) / len(lost):.1f} "
            f"| {sum(bool(r.identical) for r in rs)}/{len(rs)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()

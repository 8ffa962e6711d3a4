"""PNG screenshots of a sweep's TensorBoard: the training curves and the HPARAMS table.

    python scripts/tensorboard_screenshots.py outputs/multirun/<run_name> docs/images

Starts TensorBoard on 127.0.0.1 (a free port) and opens it in headless Chromium (Debian's
`chromium`). The legacy Scalars view is used because the default Time Series tab draws empty charts
without a GPU; `--virtual-time-budget` lets the page finish loading before the screenshot.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# file name: (view, browser window width,height)
VIEWS = {
    "tensorboard_curves.png": ("#scalars&tagFilter=^(train|val)/&_smoothingWeight=0", "1400,900"),
    "tensorboard_hparams.png": ("#hparams", "1900,600"),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit("error: no chromium on PATH (Debian/Ubuntu: apt-get install chromium)")


def wait_until_up(url: str, process: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"error: tensorboard exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(url + "data/logdir", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"error: tensorboard did not answer on {url} within {seconds:.0f} s")


def screenshot(browser: str, url: str, out: Path, size: str) -> None:
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--virtual-time-budget=20000",
            f"--window-size={size}",
            f"--screenshot={out}",
            url,
        ],
        check=True,
        capture_output=True,
        timeout=180,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir", type=Path, help="a run or sweep folder, e.g. outputs/multirun/t")
    parser.add_argument("out", type=Path, help="folder for the PNGs")
    args = parser.parse_args(argv)
    if not args.logdir.is_dir():
        raise SystemExit(f"error: {args.logdir} is not a folder (give a run or sweep folder)")
    browser = chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    board = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(args.logdir)]
        + ["--host", "127.0.0.1", "--port", str(port), "--reload_interval", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_up(url, board)
        for name, (view, size) in VIEWS.items():
            screenshot(browser, url + view, args.out / name, size)
            print(args.out / name)
    finally:
        board.terminate()
        board.wait(timeout=30)


if __name__ == "__main__":
    main()

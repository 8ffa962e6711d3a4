import os
import subprocess
import sys
from pathlib import Path

import pytest

from laptrain.run_folder import naming as run_dir
from tests.conftest import TINY, TRAIN, write_texts
from tests.in_process import train_here


def test_resume_keeps_the_folder_and_fresh_runs_never_overwrite(tmp_path, monkeypatch):
    monkeypatch.setattr(run_dir, "_chosen", {})
    base = str(tmp_path / "r")
    assert run_dir.choose_run_dir(base, True) == base
    assert run_dir.choose_run_dir(base, False) == base  # nothing there yet
    monkeypatch.setattr(run_dir, "_chosen", {})
    (tmp_path / "r" / "checkpoints").mkdir(parents=True)
    (tmp_path / "r" / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert run_dir.choose_run_dir(base, "true") == base
    assert run_dir.choose_run_dir(base, False) == base + "-2"
    # asked again in the same process (next sweep job): the same answer
    (tmp_path / "r-2" / "tensorboard").mkdir(parents=True)
    (tmp_path / "r-2" / "tensorboard" / "events.out.tfevents.1").write_bytes(b"x")
    assert run_dir.choose_run_dir(base, False) == base + "-2"


def test_job_dir_is_one_readable_level():
    assert (
        run_dir.job_dir("data.files.train=/a/b.csv,model.lr=0.1")
        == "data.files.train=_a_b.csv,model.lr=0.1"
    )
    assert run_dir.job_dir("") == "default"


def test_a_long_job_name_is_shortened_readably_and_stays_unique():
    # an Optuna trial's overrides: full-precision floats pass the 255-byte file name limit
    name = ",".join(
        [
            "experiment=tiny_sweep,hardware.batch_size=8,hardware=cpu,hparams_search=optuna",
            "model.backbone.hidden_size=32",
            "data.train_fraction=0.2500000000000001",
            "model.optimizer.lr=0.0003574712922600243",
            "model.optimizer.weight_decay=1.5702970884055395e-05",
            "model.warmup_ratio=0.19014286128198324",
        ]
    )
    short = run_dir.job_dir(name)
    assert len(short.encode()) <= run_dir.JOB_DIR_MAX
    assert "model.optimizer.lr=0.0003575," in short and "weight_decay=1.57e-05," in short
    assert run_dir.job_dir(name) == short  # a rerun finds the same folder
    assert run_dir.job_dir(name.replace("0.19014286128198324", "0.19014286128198325")) != short
    # still too long after rounding: cut, with the hash of the full name kept at the end
    longer = run_dir.job_dir(name + ",data.files.validation=" + "v" * 200)
    assert len(longer.encode()) <= run_dir.JOB_DIR_MAX and longer != short


LAUNCHES = {
    "torchrun": {"TORCHELASTIC_RUN_ID": "a1b2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"},
    "srun": {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"},
}
LAUNCH_KEYS = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID", "SLURM_STEP_ID")


def rank_0_takes(base: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """Rank 0 of a launch, in its own process: chooses with resume=false and locks the folder
    (what train.py's launch does), then stays alive."""
    code = (
        "import time; from laptrain.run_folder.naming import choose_run_dir; "
        "from laptrain.run_folder.lock import hold_run_folder; "
        f"d = choose_run_dir({str(base)!r}, False); hold_run_folder(d); "
        "print(d, flush=True); time.sleep(600)"
    )
    clean = {k: v for k, v in os.environ.items() if k not in LAUNCH_KEYS}
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**clean, **env, "RANK": "0", "WORLD_SIZE": "2"},
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, proc.stdout.readline().strip()


@pytest.mark.parametrize("launcher", sorted(LAUNCHES))
def test_every_rank_of_one_launch_takes_the_folder_rank_0_took(tmp_path, monkeypatch, launcher):
    """torchrun and srun start the ranks together and each picks the folder itself: a rank that
    looked after rank 0 had locked ``r-2`` took it for another run's and wrote to ``r-3``."""
    base = tmp_path / "r"
    (base / "checkpoints").mkdir(parents=True)
    (base / "checkpoints" / "last.ckpt").write_bytes(b"x")  # an earlier run: resume=false skips it
    for key in LAUNCH_KEYS:
        monkeypatch.delenv(key, raising=False)
    proc, chosen = rank_0_takes(base, LAUNCHES[launcher])
    try:
        assert chosen == f"{base}-2"
        for key, value in {**LAUNCHES[launcher], "RANK": "1", "WORLD_SIZE": "2"}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(run_dir, "_chosen", {})
        assert run_dir.choose_run_dir(str(base), "false") == f"{base}-2"  # rank 1: the same
        for key in LAUNCH_KEYS:  # a separate run started meanwhile leaves rank 0's folder alone
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setattr(run_dir, "_chosen", {})
        assert run_dir.choose_run_dir(str(base), False) == f"{base}-3"
    finally:
        proc.kill()
        proc.wait()


# Rank 1 of the torchrun launch starts train.py only once rank 0 has locked its folder, the order
# that lost the folder before (with both starting at once rank 1 usually chose first).
RANK_1_AFTER_RANK_0 = """
import os, runpy, sys, time
from pathlib import Path
lock = Path("outputs/t-2/.laptrain.lock")
end = time.monotonic() + 120
while os.environ.get("RANK") == "1" and time.monotonic() < end:
    if lock.is_file() and lock.read_text().strip():
        break
    time.sleep(0.1)
sys.argv[0] = {train!r}
runpy.run_path({train!r}, run_name="__main__")
"""


@pytest.mark.slow  # ~25 s: a 1-process run, then torchrun with 2 CPU ranks
def test_torchrun_ranks_with_resume_false_share_one_new_folder(tmp_path):
    """``resume=false`` beside a finished run: both ranks write into ``t-2``; before, rank 1 made
    ``t-3`` for its Hydra files and log while rank 0 trained in ``t-2``."""
    args = [
        "hardware=cpu",
        "model=tiny_classifier",
        "data=text_csv",
        *TINY,
        f"data.files.train={write_texts(tmp_path / 'texts.csv')}",
        "trainer.max_steps=2",
        "test=false",
        "run_name=t",
    ]
    first = train_here(args, tmp_path)  # the 1-process run needs no process of its own
    assert first.returncode == 0, first.stderr[-3000:]
    wrapper = tmp_path / "rank_1_after_rank_0.py"
    wrapper.write_text(RANK_1_AFTER_RANK_0.format(train=str(TRAIN)))
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    ddp = ["trainer=ddp_cpu", "trainer.strategy=ddp", "resume=false"]
    env = {**os.environ, "LAPTRAIN_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [*launcher, str(wrapper), *args, *ddp],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = tmp_path / "outputs"
    assert sorted(p.name for p in outputs.iterdir()) == ["t", "t-2"]
    assert (outputs / "t-2" / "checkpoints" / "last.ckpt").is_file()

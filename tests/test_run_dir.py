from laptrain import run_dir


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

from laptrain.run_folder import naming as run_dir


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

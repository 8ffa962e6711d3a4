"""LightningDataModules (text classification, instructions, Sudoku), the files they read and the
checks on them (``labelled_files``, ``instruction_rows``, ``precheck``: before the run folder
exists), length-grouped resumable batches (``sampler``), per-batch padding (``collate``), and
``contracts``: what the run and the preflight may ask of a datamodule."""

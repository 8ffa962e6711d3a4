"""Data plumbing any datamodule may use (the families' own datamodules are in their wings):
reading labelled files and checking them (``file_formats``, ``labelled_files``, ``precheck``:
before the run folder exists), splits, length-grouped
resumable batches (``sampler``), per-batch padding (``collate``), worker counts, a user's plain
loaders, and ``contracts``: what the run and the preflight may ask of a datamodule."""

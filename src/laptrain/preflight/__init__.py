"""The memory preflight: estimate a job's peak memory before training and plan its micro batch
(mirrors ``conf/preflight/``)."""

"""Everything about a run's checkpoints: how ``last.ckpt`` is written, found and checked.

- :mod:`.files`: the bytes (atomic writes, the rename into place, reading one back safely).
- :mod:`.last`: where ``last.ckpt`` is (one ``paths.last_ckpt`` per run, for every save).
- :mod:`.saves`: saves during a fit, at once or queued to the end of the batch's hooks.
- :mod:`.stop`: :func:`~.stop.request_stop`, the stop every guard asks for, saved at a clean
  batch boundary and put in place at the end of fit.
- :mod:`.resume`: which checkpoint a run resumes from, checked against the model first.

Callbacks and the job call these; nothing else writes or looks up ``last.ckpt``.
"""

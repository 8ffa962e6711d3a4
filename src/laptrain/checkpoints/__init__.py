"""Everything about a run's checkpoints: how ``last.ckpt`` is written, found and checked.

- :mod:`.files`: the bytes (atomic writes, the rename into place, reading one back safely).
- :mod:`.last`: where ``last.ckpt`` is (one ``paths.last_ckpt`` per run, for every save).
- :mod:`.stop`: :func:`~.stop.request_stop`, the one call of every guard that stops a run, and
  :class:`~.stop.Stops`, one per trainer: saves queued to the end of the batch's hooks, stops
  retried at the next clean boundary, the stop put in place and the end-of-fit save.
- :mod:`.resume`: which checkpoint a run resumes from, checked against the model first.

Callbacks and the job call these; nothing else writes or looks up ``last.ckpt``.
"""

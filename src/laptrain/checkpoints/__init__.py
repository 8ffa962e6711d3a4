"""Everything about a run's checkpoints: the bytes (:mod:`.checkpoint_io`), where ``last.ckpt`` is
(:mod:`.last`), the one stop call of every guard and the saves of a fit (:mod:`.stop`), and
which checkpoint a run resumes from (:mod:`.resume`). Nothing else writes or looks up
``last.ckpt``."""

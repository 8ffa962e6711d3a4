"""laptrain's Optuna sweeper for Hydra 1.3: ``hydra/sweeper=laptrain_optuna`` (``hparams_search=optuna``).

Hydra finds it because it lives in the ``hydra_plugins`` namespace package; see optuna_sweeper.py.
"""

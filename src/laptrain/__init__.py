"""laptrain: Lightning + Hydra training for the machine you have."""

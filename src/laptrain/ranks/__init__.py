"""The ranks of a run: how many processes its config starts and who starts them (``processes``),
and which rank this process is (``environment``)."""

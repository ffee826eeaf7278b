"""The virtual clock: the whole control loop in one process, without wall time."""

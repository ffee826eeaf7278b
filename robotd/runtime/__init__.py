"""The main process (the async lane): the daemon and what it starts, watches and stops."""

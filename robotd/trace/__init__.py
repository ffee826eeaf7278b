"""Trace: every episode recorded crash-safe in MCAP, read back, shown, served live, exported.

Modules: `schemas` (the channel table), `codec` (records ⇄ JSON bytes), `store` (what the
daemon calls: `TraceStore`, `EpisodeWriter`), `writer` (the writer thread), `outbox` (the
bounded queue between them), `mcapfile` / `mcapscan` (writing and strictly scanning MCAP),
`reader` (reading back, torn files included), `budget` (the disk budget), `rundir` (run
directories), `options` / `start` (the ``[trace]`` config), `show` / `ls` (the CLI),
`live` (Foxglove live view), `replay_input` / `replay` (``robotd replay``: an episode run
again through the tick code), `lerobot` / `video` / `export` (dataset export). The daemon's
mapping of what it sees onto the channels is robotd.runtime.recorder.

This package's ``__init__`` imports nothing, so that loading the config stays light.
"""

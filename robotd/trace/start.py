"""The one call that turns the ``[trace]`` config into the daemon's `TraceStore`."""

from __future__ import annotations

from typing import Any

from robotd.trace.options import TraceOptions, trace_root
from robotd.trace.store import TraceStore
from robotd.trace.writer import Sink


def open_store(
    options: TraceOptions, config_snapshot: dict[str, Any], *, live: Sink | None = None
) -> TraceStore | None:
    """The daemon's trace: a store recording under `trace_root` (and feeding `live`), a store
    feeding `live` alone when recording is off, or None when neither is wanted."""
    if not options.enabled and live is None:
        return None
    return TraceStore(
        trace_root(options) if options.enabled else None,
        options.max_bytes,
        config_snapshot,
        tick_every=options.tick_every(),
        frames=options.frames is not False,
        frame_quality=options.frame_quality,
        flush_s=options.flush_s,
        flush_bytes=options.flush_bytes,
        fsync=options.fsync,
        compression=options.compression,
        queue_records=options.queue_records,
        queue_bytes=options.queue_bytes,
        live=live,
    )

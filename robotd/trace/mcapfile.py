"""One MCAP file being written: chunked, zstd-compressed, CRCs on, flushed on demand.

Used only by the trace's writer thread. Each `flush` ends the chunk in progress, so what
is on disk is whole chunks (each with its CRC) up to the last flush: a crash loses at
most what came after it, and the reader never takes a torn chunk for data.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, BinaryIO

from mcap.writer import CompressionType, Writer

from robotd.trace.rundir import robotd_version
from robotd.trace.schemas import ChannelSpec

COMPRESSION = {
    "zstd": CompressionType.ZSTD,
    "lz4": CompressionType.LZ4,
    "none": CompressionType.NONE,
}
PROFILE = ""  # no ROS profile: JSON messages with JSON schemas
META_EPISODE = "robotd.episode"
META_END = "robotd.episode_end"


def _strings(data: dict[str, Any]) -> dict[str, str]:
    """MCAP metadata holds strings: every value is written as JSON."""
    return {str(k): json.dumps(v, default=str) for k, v in data.items()}


class McapFile:
    """An MCAP file opened for writing (never an existing file, never through a symlink)."""

    def __init__(
        self,
        path: Path,
        metadata: dict[str, Any],
        *,
        compression: str = "zstd",
        chunk_bytes: int = 4 << 20,
        fsync: bool = True,
    ) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o640)
        self.path = path
        self._file: BinaryIO = os.fdopen(fd, "wb", buffering=1 << 16)
        self._fsync = fsync
        self._schemas: dict[str, int] = {}
        self._channels: dict[str, int] = {}
        self._sequence: dict[int, int] = {}
        self.unflushed = 0  # message bytes since the last flush
        self.messages = 0
        self.bytes = 0
        try:
            # the chunk limit only guards memory: our own flushes end chunks first
            self._mcap = Writer(
                self._file,
                chunk_size=chunk_bytes,
                compression=COMPRESSION[compression],
                enable_crcs=True,
            )
            self._mcap.start(profile=PROFILE, library=f"robotd {robotd_version()}")
            self._mcap.add_metadata(META_EPISODE, _strings(metadata))
            self.flush()
        except BaseException:
            # a file that could not even be started (a full disk) is not left behind: the
            # next attempt takes the same name, not a -N one beside a stub
            self.abandon()
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise

    def _channel(self, spec: ChannelSpec) -> int:
        cid = self._channels.get(spec.topic)
        if cid is None:
            sid = self._schemas.get(spec.schema_name)
            if sid is None:
                sid = self._mcap.register_schema(spec.schema_name, "jsonschema", spec.schema_bytes)
                self._schemas[spec.schema_name] = sid
            cid = self._mcap.register_channel(spec.topic, "json", sid)
            self._channels[spec.topic] = cid
            self._sequence[cid] = 0
        return cid

    def add(self, spec: ChannelSpec, log_time_ns: int, data: bytes) -> None:
        cid = self._channel(spec)
        seq = self._sequence[cid] = self._sequence[cid] + 1
        self._mcap.add_message(cid, log_time_ns, data, log_time_ns, sequence=seq)
        self.unflushed += len(data)
        self.messages += 1
        self.bytes += len(data)

    def flush(self) -> None:
        """End the chunk in progress and hand everything to the kernel (fsync when asked)."""
        self._mcap.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
        self.unflushed = 0

    def finish(self, end: dict[str, Any]) -> None:
        """Write the end metadata, the summary and the footer, and close the file."""
        try:
            self._mcap.add_metadata(META_END, _strings(end))
            self._mcap.finish()
            self._file.flush()
            if self._fsync:
                os.fsync(self._file.fileno())
        finally:
            self._file.close()

    def abandon(self) -> None:
        """Close without a footer (after a write error): the reader recovers what is whole."""
        with contextlib.suppress(OSError):
            self._file.close()

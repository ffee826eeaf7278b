"""Reading a trace back: every whole record, and a plain word on what was not whole.

`TraceReader(path).messages()` yields the decoded records in file order; afterwards
`status` says whether the file was closed cleanly (``complete``), and if not, whether it
merely stops (the writer died between flushes: ``torn`` is False) or ends in a cut or
damaged record (``torn`` is True), with a message naming the byte and what was lost.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robotd.trace import codec
from robotd.trace.mcapfile import META_END, META_EPISODE
from robotd.trace.mcapscan import (
    Channel,
    Message,
    Metadata,
    ScanError,
    Schema,
    Skipped,
    Stop,
    scan,
)


class TraceError(ValueError):
    """A file that cannot be read as a trace at all (missing, not MCAP)."""


@dataclass(frozen=True)
class TraceMessage:
    topic: str
    log_time: int  # ns since the Unix epoch
    sequence: int  # per channel, from 1: a gap means records were lost before the writer
    record: dict[str, Any]


@dataclass
class ReadStatus:
    path: Path
    size: int = 0
    offset: int = 0  # bytes read as whole records
    complete: bool = False  # closed cleanly (footer found)
    torn: bool = False  # ends in a cut or damaged record
    damage: str = ""
    messages: int = 0
    bad_messages: int = 0  # whole, CRC-valid messages that are not robotd records
    first_bad: str = ""
    gaps: int = 0  # breaks in a channel's sequence numbers: whole chunks missing
    first_gap: str = ""
    skipped: list[str] = field(default_factory=list)  # damaged records outside the chunks

    @property
    def recovered(self) -> bool:
        """The file was not closed cleanly; what was read is what was whole."""
        return not self.complete

    @property
    def message(self) -> str:
        if self.complete:
            text = f"{self.path.name}: complete, {self.messages} messages"
        elif self.torn:
            lost = self.size - self.offset
            text = (
                f"{self.path.name}: torn: {self.damage}; recovered {self.messages} messages "
                f"up to the last whole record (byte {self.offset} of {self.size}, "
                f"{lost} bytes after it ignored)"
            )
        else:
            text = (
                f"{self.path.name}: not closed (the writer stopped); all {self.messages} "
                f"messages up to its last flush recovered"
            )
        if self.bad_messages:
            text += f"; {self.bad_messages} unreadable messages skipped ({self.first_bad})"
        if self.skipped:
            text += f"; {len(self.skipped)} damaged records skipped ({self.skipped[0]})"
        if self.gaps:
            text += f"; {self.gaps} breaks in the record sequence ({self.first_gap})"
        return text


def _metadata_values(values: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, text in values.items():
        try:
            out[key] = json.loads(text)
        except ValueError:
            out[key] = text
    return out


@dataclass
class TraceReader:
    """One trace file, read sequentially (nothing held but the current chunk)."""

    path: Path
    status: ReadStatus = field(init=False)
    metadata: dict[str, dict[str, Any]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.status = ReadStatus(self.path)

    def messages(self, topics: Iterable[str] | None = None) -> Iterator[TraceMessage]:
        """The records of the file in order (of `topics` only, when given)."""
        wanted = set(topics) if topics is not None else None
        self.status = st = ReadStatus(self.path)
        try:
            # O_NONBLOCK: a FIFO given as a trace must not block the open waiting for a writer
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise TraceError(f"{self.path}: {exc.strerror}") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            what = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise TraceError(f"{self.path}: {what}, not a trace file (robotd trace ls DIR "
                             "lists a directory's episodes)")
        with os.fdopen(fd, "rb") as f:
            st.size = info.st_size
            yield from self._walk(f, st, wanted)

    def _walk(self, f: Any, st: ReadStatus, wanted: set[str] | None) -> Iterator[TraceMessage]:
        channels: dict[int, tuple[str, str]] = {}
        last_seq: dict[int, int] = {}
        try:
            records = scan(f, st.size)
            for rec in records:
                if isinstance(rec, Message):
                    topic, enc = channels.get(rec.channel_id, ("", ""))
                    prev = last_seq.get(rec.channel_id, 0)
                    if rec.sequence != prev + 1:
                        st.gaps += 1
                        st.first_gap = st.first_gap or (
                            f"{topic or rec.channel_id}: {prev} then {rec.sequence}")
                    last_seq[rec.channel_id] = rec.sequence
                    if not topic:
                        self._bad(st, f"a message on unknown channel {rec.channel_id}")
                    elif wanted is None or topic in wanted:
                        msg = self._decode(st, topic, enc, rec)
                        if msg is not None:
                            yield msg
                    else:  # whole, not asked for: counted, so every reader says one number
                        st.messages += 1
                elif isinstance(rec, Channel):
                    channels[rec.id] = (rec.topic, rec.encoding)
                elif isinstance(rec, Metadata):
                    self.metadata[rec.name] = _metadata_values(rec.values)
                elif isinstance(rec, Stop):
                    st.offset, st.complete = rec.offset, rec.complete
                    st.torn, st.damage = bool(rec.damage), rec.damage
                elif isinstance(rec, Skipped) and len(st.skipped) < 100:
                    st.skipped.append(f"{rec.why} at byte {rec.offset}")
                elif not isinstance(rec, Schema):
                    raise AssertionError(rec)
        except ScanError as exc:
            raise TraceError(f"{self.path}: {exc}") from None

    def _decode(self, st: ReadStatus, topic: str, enc: str, rec: Message) -> TraceMessage | None:
        if enc != "json":
            self._bad(st, f"{topic}: message encoding {enc!r}")
            return None
        try:
            record = codec.decode(rec.data)
        except codec.DecodeError as exc:
            self._bad(st, f"{topic}: {exc}")
            return None
        st.messages += 1
        return TraceMessage(topic, rec.log_time, rec.sequence, record)

    @staticmethod
    def _bad(st: ReadStatus, why: str) -> None:
        st.bad_messages += 1
        if not st.first_bad:
            st.first_bad = why

    @property
    def episode(self) -> dict[str, Any]:
        """The episode's start metadata (episode, task, run, hz, tick_every, ...)."""
        return self.metadata.get(META_EPISODE, {})

    @property
    def end(self) -> dict[str, Any] | None:
        """The episode's end metadata (outcome, verdict, counts), None when it never ended."""
        return self.metadata.get(META_END)


def read_all(path: Path | str, topics: Iterable[str] | None = None) -> tuple[
    list[TraceMessage], TraceReader
]:
    """Every message of a file in memory, with the reader (status, metadata)."""
    reader = TraceReader(Path(path))
    return list(reader.messages(topics)), reader

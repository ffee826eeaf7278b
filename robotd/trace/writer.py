"""The trace's writer thread: encodes records, writes MCAP files, flushes, keeps the budget.

Everything slow happens here, never on the event loop: JSON encoding, compression, file
I/O, fsync, deleting old runs. Items arrive in order through the `Outbox`; the thread
wakes every `poll_s` (or at once for control items), drains what is there, records any
drops as an event, and flushes each open file once `flush_s` has passed or `flush_bytes`
are pending. Errors are logged and counted; the thread never dies of one.

This module decides what goes where: records and frames encoded into the episode open now
(or the session file), episodes begun and ended, verdicts, drops. The files themselves,
their flushing, write errors, sidecars and the disk budget are robotd.trace.openfiles'.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from robotd.trace import codec
from robotd.trace.episodes import OpenFile, iso_now, refusal
from robotd.trace.openfiles import OpenFiles
from robotd.trace.outbox import Outbox
from robotd.trace.rundir import episode_name
from robotd.trace.schemas import (
    CHANNELS,
    EPISODE_END,
    EPISODE_START,
    EVENTS,
    TICK,
    TRACE_DROP,
    ChannelSpec,
    spec_for,
)
from robotd.trace.sink import Sink, WriterSettings, jpeg

log = logging.getLogger("robotd.trace")
_EVENT_SPEC = CHANNELS[EVENTS]
__all__ = ["Sink", "WriterSettings", "WriterThread"]


class WriterThread(threading.Thread):
    def __init__(
        self, outbox: Outbox, run_dir: Path | None, settings: WriterSettings, sink: Sink | None
    ) -> None:
        super().__init__(name="robotd-trace", daemon=True)
        self.outbox, self.run_dir, self.settings, self.sink = outbox, run_dir, settings, sink
        self.disk = OpenFiles(run_dir, settings, self._complain)
        self.current: int | None = None
        self.sidecars: dict[int, tuple[Path, dict[str, Any]]] = {}  # episode -> ended sidecar
        self.records = self.frames = self.bytes = self.errors = 0
        self.encoded = self.encode_ns = 0  # frames given as pixels, and their JPEG time
        self.cpu_ns = 0  # this thread's CPU time, as of its last drain (for the stats)
        self._drops_seen = (0, 0)
        self._complaints: dict[str, int] = {}

    # ---- the loop
    def run(self) -> None:
        self.disk.budget()
        closing = False
        while not closing:
            self.outbox.wake.wait(self.settings.poll_s)
            self.outbox.wake.clear()
            while (item := self.outbox.take()) is not None:
                try:
                    closing = self._handle(item) or closing
                except Exception as exc:
                    self._complain(f"item:{item[0]}", f"trace: {item[0]}: {exc!r}")
            self._note_drops(self._drops_before_next_control())
            self.disk.flush_due()
            self.cpu_ns = time.thread_time_ns()
        self._shutdown()
        self.cpu_ns = time.thread_time_ns()

    def _handle(self, item: tuple[Any, ...]) -> bool:
        kind = item[0]
        if kind == "m":
            self._message(item[1], item[2], item[3], item[4])
            return False
        if kind == "f":
            self.outbox.bytes_out += len(item[4])
            self._frame(*item[1:])
            return False
        if kind == "p":
            self.outbox.bytes_out += item[4].nbytes
            self._pixels(*item[1:])
            return False
        # the drops counted before this item was queued belong to the file open now,
        # before the item changes it; those counted since, to the file it opens
        self._note_drops(self.outbox.control_marks.popleft())
        if kind == "begin":
            self._begin(*item[1:])
        elif kind == "end":
            self._end(*item[1:])
        elif kind == "verdict":
            self._verdict(*item[1:])
        elif kind == "sync":
            for f in self.disk.writable():
                self.disk.flush(f)
            item[1].set()
        elif kind == "close":
            return True
        return False

    # ---- messages
    def _file_for(self, key: int | None) -> OpenFile | None:
        f = self.disk.files.get(self.current if key is None else key)  # type: ignore[arg-type]
        # an episode file a write error closed keeps its messages (counted as lost in its
        # sidecar): they are the episode's, not the session's
        return self.disk.session_file() if f is None else f

    def _message(self, key: int | None, topic: str, log_time_ns: int, record: Any) -> None:
        spec = spec_for(topic)
        if spec is None:
            self._complain(f"topic:{topic}", f"trace: no channel {topic!r}; record dropped")
            return
        try:
            data = codec.encode(record)
        except (TypeError, ValueError) as exc:
            self._complain(f"encode:{topic}", f"trace: {topic}: cannot encode a record: {exc}")
            return
        target = self._file_for(key)
        if target is not None and topic == TICK:
            target.saw_tick(log_time_ns, record)
        self._emit(target, spec, log_time_ns, data)
        self.records += 1

    def _frame(
        self, key: int | None, topic: str, log_time_ns: int, jpeg: bytes, index: int, fmt: str
    ) -> None:
        spec = spec_for(topic)
        if spec is None:
            self._complain(f"topic:{topic}", f"trace: no camera channel {topic!r}")
            return
        data = codec.encode_frame(topic.rsplit("/", 1)[-1], log_time_ns, jpeg, index, fmt)
        target = self._file_for(key)
        if target is not None:
            target.frames += 1
        self._emit(target, spec, log_time_ns, data)
        self.frames += 1

    def _pixels(self, key: int | None, topic: str, t: int, pixels: Any, index: int) -> None:
        """A frame given as RGB pixels: JPEG-encoded here, off the event loop."""
        t0 = time.perf_counter_ns()
        try:
            data = jpeg(pixels, self.settings.frame_quality)
        except Exception as exc:  # cv2.error, a bad array: one frame lost, said once
            self._complain(f"jpeg:{topic}", f"trace: {topic}: cannot encode a frame: {exc}")
            return
        self.encode_ns += time.perf_counter_ns() - t0
        self.encoded += 1
        self._frame(key, topic, t, data, index, "jpeg")

    def _emit(self, target: OpenFile | None, spec: ChannelSpec, t: int, data: bytes) -> None:
        if self.sink is not None:
            try:
                self.sink.publish(spec, t, data)
            except Exception as exc:
                self._complain("sink", f"trace: live view: {exc!r}")
        if target is None:
            return
        target.seen += 1
        if target.broken:
            return
        try:
            target.file.add(spec, t, data)
            self.bytes += len(data)
            self.disk.since_budget += len(data)
            if target.file.unflushed >= self.settings.flush_bytes:
                self.disk.flush(target)
        except OSError as exc:
            self.disk.broken(target, exc)

    def _event(
        self, target: OpenFile | None, name: str, detail: dict[str, Any], t: int | None = None,
        tick: int | None = None,
    ) -> None:
        data = codec.encode({"name": name, "tick": tick, "detail": detail})
        self._emit(target, _EVENT_SPEC, time.time_ns() if t is None else t, data)

    def _drops_before_next_control(self) -> tuple[int, int]:
        """The drop counts now, but none past those of a control item queued and not yet
        taken: drops counted after it was queued belong to the file it opens."""
        live = (self.outbox.dropped_records, self.outbox.dropped_frames)
        marks = self.outbox.control_marks
        if not marks:
            return live
        try:
            mark = marks[0]
        except IndexError:  # taken meanwhile: there is no such item
            return live
        return (min(live[0], mark[0]), min(live[1], mark[1]))

    def _note_drops(self, upto: tuple[int, int] | None = None) -> None:
        """Record the drops since the last noted (up to `upto`, the counts a control item
        was queued at), as a trace_drop event in the file open now."""
        now = (self.outbox.dropped_records, self.outbox.dropped_frames) if upto is None else upto
        records, frames = now[0] - self._drops_seen[0], now[1] - self._drops_seen[1]
        if (records or frames) and records >= 0 and frames >= 0:
            self._drops_seen = now
            log.warning("trace: queue full: %d records and %d frames dropped", records, frames)
            detail = {"records": records, "frames": frames, "total_records": now[0],
                      "total_frames": now[1]}
            self._event(self._file_for(None), TRACE_DROP, detail)

    # ---- episodes
    def _begin(self, key: int, episode: int, wep: str, task: str | None, t: int,
               tick: int | None = None) -> None:
        if self.current is not None:
            self._end(self.current, "superseded", None, t)
        self.current = key
        start = {"episode": episode, "worker_episode": wep, "task": task}
        if self.run_dir is None:  # a live view alone
            self._event(None, EPISODE_START, start, t, tick)
            return
        info = {"episode": episode, "worker_episode": wep, "task": task,
                "run": self.run_dir.name, "started": iso_now(), "ended": None,
                "outcome": None, "verdict": None, **dict(self.settings.episode_meta)}
        try:
            mf = self.disk.open_mcap(episode_name(episode), info)
        except OSError as exc:
            self.disk.refused = refusal(episode_name(episode) + ".mcap", exc)
            self._complain("open", f"trace: cannot open episode {episode}'s file: {exc}")
            return
        self.disk.refused = None
        f = OpenFile(mf, episode, mf.path.with_suffix(".json"), info={**info, "file": mf.path.name})
        self.disk.files[key] = f
        self._event(f, EPISODE_START, start, t, tick)
        self.disk.sidecar(f)

    def _end(self, key: int, outcome: str, verdict: Any, t: int, tick: int | None = None,
             detail: dict[str, Any] | None = None) -> None:
        was_current = self.current == key
        if was_current:
            self.current = None
        f = self.disk.files.pop(key, None)
        extra = detail if isinstance(detail, dict) else {}
        if f is None:
            if was_current:  # a live view alone, or a file that never opened
                self._event(None, EPISODE_END, {**extra, "outcome": outcome, "verdict": verdict},
                            t, tick)
            return
        if verdict is None:
            verdict = f.info.get("verdict")
        self._event(f, EPISODE_END, {**extra, "outcome": outcome, "verdict": verdict}, t, tick)
        cause = str(extra.get("cause") or "")  # a fault's: estop, driver, watchdog, ...
        f.info.update(outcome=outcome, cause=cause, verdict=verdict, ended=iso_now())
        self.disk.close(f, {"outcome": outcome, "cause": cause, "verdict": verdict,
                            **f.summary()})
        if f.sidecar is not None and f.episode is not None:
            self.sidecars[f.episode] = (f.sidecar, {**f.info, **f.summary()})
        self.disk.budget()

    def _verdict(self, episode: int, verdict: Any) -> None:
        for f in self.disk.files.values():
            if f.episode == episode:
                f.info["verdict"] = verdict
                self._event(f, "verdict", {"episode": episode, "verdict": verdict})
                return
        if episode in self.sidecars:
            path, info = self.sidecars[episode]
            info["verdict"] = verdict
            if exc := self.disk.pending.write(path, info):
                self._complain("verdict", f"trace: cannot record the verdict in {path} yet: "
                               f"{exc}")
        self._event(self.disk.session_file(), "verdict", {"episode": episode, "verdict": verdict})

    def _shutdown(self) -> None:
        for key in list(self.disk.files):
            self._end(key, "daemon_stopped", None, time.time_ns())
        self.disk.close_session()
        if self.sink is not None:
            try:
                self.sink.close()
            except Exception as exc:
                self._complain("sink", f"trace: live view close: {exc!r}")

    def _complain(self, key: str, text: str) -> None:
        self.errors += 1
        n = self._complaints[key] = self._complaints.get(key, 0) + 1
        if n == 1 or n % 1000 == 0:
            log.error("%s%s", text, f" ({n} times)" if n > 1 else "")

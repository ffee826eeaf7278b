"""Getting an act ready for its copy off the poll loop: decoding what the decoder did not do
ahead, and packing the window (robotd.worker.pipe), on a thread of its own, so that the
poll loop keeps answering (pings above all) whatever an act's window holds."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Mapping
from typing import Any

import zmq

from robotd import wire
from robotd.worker import pipe
from robotd.worker.decoding import decode_window, decoded_window
from robotd.worker.policy_host import PolicyCallError

log = logging.getLogger("robotd.worker")

OK, ERROR = b"ok", b"err"


class Preparer:
    """Prepares acts in order. Each result goes to the poll loop on an inproc PAIR bound at
    `addr`, as frames `[identity, seq (8 bytes), OK, *message]` or `[identity, seq, ERROR,
    msgpack {code, message}]` (a frame that does not decode: bad_frame)."""

    def __init__(self, ctx: zmq.Context, addr: str, layouts: Mapping[str, str]) -> None:
        self._ctx, self._addr, self._layouts = ctx, addr, dict(layouts)
        self._jobs: queue.SimpleQueue[tuple[bytes, int, dict[str, Any], list] | None]
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="robotd-prepare", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(
        self, identity: bytes, seq: int, header: dict[str, Any], observations: list[dict]
    ) -> None:
        """Queue an act: `header` is its message without observations (it has `steps`)."""
        self._jobs.put((identity, seq, header, observations))

    def pack_now(self, header: dict[str, Any], observations: list[dict]) -> list[Any] | None:
        """The act's frames at once, on the caller's thread, when its window needs no
        decoding (no uploaded frame, or each decoded ahead): packing copies no array, so it
        costs microseconds and two thread hops less. None: `submit` it."""
        window = decoded_window(observations)
        if window is None:
            return None
        try:
            return pipe.pack({**header, "observations": window})
        except wire.WireError:
            return None  # submitted: the preparer answers the error

    def decode_now(self, steps: list[int], observations: list[dict]) -> list[dict[str, Any]]:
        """The window decoded on the caller's thread (an inline copy: the poll loop waits for
        the policy anyway); PolicyCallError naming a frame that does not decode."""
        return decode_window(self._layouts, steps, observations)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        out = self._ctx.socket(zmq.PAIR)
        out.setsockopt(zmq.LINGER, 0)
        out.connect(self._addr)
        try:
            while (job := self._jobs.get()) is not None:
                identity, seq, header, observations = job
                tag = [identity, seq.to_bytes(8, "little")]
                try:
                    header["observations"] = decode_window(
                        self._layouts, header["steps"], observations
                    )
                    frames = pipe.pack(header)
                except PolicyCallError as err:
                    error = {"code": err.code, "message": str(err)}
                    out.send_multipart([*tag, ERROR, wire.packb(error)])
                    continue
                except (wire.WireError, MemoryError) as err:
                    error = {"code": "internal", "message": f"cannot hand the act over: {err}"}
                    out.send_multipart([*tag, ERROR, wire.packb(error)])
                    continue
                with contextlib.suppress(zmq.ZMQError):
                    out.send_multipart([*tag, OK, *frames], copy=False)
        finally:
            out.close(linger=0)

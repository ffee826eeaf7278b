"""lane.sock, the e-stop's own door into the control lane: it takes `Estop` and nothing else.

E-stops are taken first at every tick and, between ticks, at once: the loop's sleep
watches the socket (`EstopDesk.sleep` is the ticker's sleep), so an e-stop arriving
mid-period latches and has a safe command written within about a millisecond, not at the
next deadline. Each is acknowledged once its safe command is written (`Reply.written_ns`);
when the driver could not write it (the bus gone, a servo not answering) the answer says
so instead (ok false, code NOT_WRITTEN: latched, but the robot may not be stopped; the
lane tries again every tick). An e-stop is carried out whatever else is wrong with its
message (robotd.lane.salvage); anything else is refused with a reply saying why, and counted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import zmq

from robotd.control.kernel import Kernel
from robotd.lane import codec
from robotd.lane.messages import MAX_TEXT, NOT_WRITTEN, Estop, Event, Reply, Status
from robotd.lane.salvage import salvage_estop, split_envelope

MAX_PER_CALL = 8
MAX_SAID = 300
LABEL = "e-stop on lane.sock"  # the reason of an e-stop that gave none (or none readable)


class EstopDesk:
    """Serves lane.sock for one control lane.

    `safe_now()` writes a safe command at once (torque off, or the last approved target)
    and returns when it was done; `failed()` the error of that write, None when it went
    out; `bad(name, error)` counts and reports a refused message; `flush()` sends what the
    kernel emitted (called after an e-stop between ticks).
    """

    def __init__(
        self,
        sock: zmq.Socket,
        kernel: Kernel,
        *,
        safe_now: Callable[[], int],
        failed: Callable[[], str | None],
        bad: Callable[[str, str], None],
        flush: Callable[[], None],
    ) -> None:
        self.sock = sock
        self.kernel = kernel
        self.safe_now = safe_now
        self.failed = failed
        self.bad = bad
        self.flush = flush
        # latched, not yet acknowledged: (reply envelope, the e-stop's id)
        self.pending: list[tuple[tuple[bytes, ...], int | None]] = []
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)

    def waiting(self) -> bool:
        # EVENTS, not a recv in a try: an empty recv costs an exception every tick.
        return bool(self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN)

    def drain(self) -> None:
        """Take what waits on lane.sock (at most MAX_PER_CALL)."""
        for _ in range(MAX_PER_CALL if self.waiting() else 0):
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._take(frames)

    def _take(self, frames: list[bytes]) -> None:
        """Latch the e-stop in `frames` (in any of them, however malformed otherwise: see
        robotd.lane.salvage), or refuse the message with a reply saying why."""
        head, bodies = split_envelope(frames)
        envelope = tuple(head)
        error = "an empty message"
        for body in bodies:
            try:
                msg = codec.decode_estop(body)
            except codec.LaneError as exc:
                got = salvage_estop(
                    body,
                    kind_key="k",
                    reason_in_args=False,
                    max_bytes=codec.MAX_ESTOP_BYTES,
                    max_reason=MAX_TEXT,
                    max_str_id=None,
                    label=LABEL,
                )
                if got is None:
                    error = str(exc)
                    continue
                self.bad("lane_estop_salvaged", f"an e-stop carried out despite: {exc}")
                rid = got.rid if isinstance(got.rid, int) else None
                msg = Estop(rid, got.reason, got.sent_ns or 0)
            self._latch(envelope, msg)
            return
        said = f"lane.sock takes the e-stop only: {error}"
        self.bad("lane_refused", said)
        self._answer(envelope, Reply(None, False, code="refused", message=said[:MAX_SAID]))

    def _latch(self, envelope: tuple[bytes, ...], msg: Estop) -> None:
        # A send time later than now (another clock's, or a client's bug) would supersede
        # every command after it for good: the robot could never be cleared without a restart.
        sent = min(msg.sent_ns, time.monotonic_ns())
        k = self.kernel
        k.command("estop", msg.reason or LABEL, sent_ns=sent)
        k.emit(Event("lane_estop", k.counters.ticks, {"reason": msg.reason}))
        self.pending.append((envelope, msg.id))

    def ack(self, written_ns: int) -> None:
        """Answer the latched e-stops: written at `written_ns`, or not (`failed()`)."""
        status, failed = self.kernel.status(), self.failed()
        for envelope, rid in self.pending:
            self._answer(envelope, written_reply(rid, status, written_ns, failed))
        self.pending.clear()
        # and up to the main process with this tick's batch: its status would otherwise
        # show the state before the e-stop until the next stats (up to stats_interval_s)
        self.kernel.emit(status)

    def _answer(self, envelope: tuple[bytes, ...], reply: Reply) -> None:
        # The asker may be gone or not reading: the e-stop itself latched anyway.
        with contextlib.suppress(zmq.ZMQError):
            self.sock.send_multipart([*envelope, codec.encode(reply)], zmq.NOBLOCK)

    def sleep(self, seconds: float) -> None:
        """The loop's sleep: wait `seconds`, taking any e-stop that arrives meanwhile at
        once (latched, a safe command written, acknowledged)."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            if left < 0.001:  # below poll's millisecond: the precise sleep for the rest
                time.sleep(left)
                return
            if self._poller.poll(int(left * 1000)):
                self.drain()
                if self.pending:
                    self.ack(self.safe_now())
                    self.flush()


def written_reply(rid: int | None, status: Status, written_ns: int, failed: str | None) -> Reply:
    """The answer to an e-stop once its tick wrote (or tried to write) the safe command."""
    if failed is None:
        return Reply(rid, True, status, written_ns=written_ns)
    said = (
        f"the e-stop is latched but its safe command was not written ({failed}): the robot "
        "may NOT be stopped; the control lane tries again every tick"
    )
    return Reply(rid, False, status, code=NOT_WRITTEN, message=said)

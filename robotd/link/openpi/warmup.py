"""The openpi link's warm-up inference: its gate, its state and what it logs.

Why: an openpi policy JIT-compiles its forward pass on its first inference (JAX compiles
once per input shape and dtype; openpi issue #271: "the first inference call takes some
time as the forward pass compiles"), which takes longer than an act's timeout
(policy.timeout_s) and the robot's patience (control.max_hold_steps / hz). Without a
warm-up the first act of a run times out and its episode ends `starved`. So after each
connect (a restarted server compiles again) the link sends one request shaped as a first
act, with neutral contents (OpenpiActs.warmup_request), and discards its answer.

The link (robotd.link.openpi.client) holds one `Warmup` and does the I/O; here:
- `arm(acts)`: at a connect, acts are held from now on (the returned gate) until
  `end(gate)`. Not armed (None) when warmup_s is 0, or when the server failed the last
  warm-up and no act was answered since (a warm-up the server fails closes the connection,
  openpi's way: repeated at every reconnect it would keep the robot from ever working).
- `sent`, `answered`, `timed_out`, `failed`, `late`: what became of it, logged (INFO when
  it answered, a WARNING otherwise) and kept for `words()`, the link's status.
- `wait()`: returns once no warm-up holds acts; at most warmup_s + WAIT_SLACK_S, whatever
  happens (a warm-up whose task never ran must not hold acts for ever).

Nothing here trusts the server: `reply_problem` says what is wrong with a reply frame,
bounded (codec's own bounds; a text frame's last line at 300 characters).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from robotd.link.openpi import codec, wire
from robotd.link.openpi.errors import CodecError, ConnectionLost, ServerError

log = logging.getLogger("robotd.link.openpi")

# The link's exchange for it: request, timeout -> the reply frame, None when none came in
# time (the connection kept, the reply owed); CodecError, ServerError or ConnectionLost.
Exchange = Callable[[Mapping[str, Any], float], Awaitable[str | bytes | None]]

# An act waits this much longer than warmup_s for a gate before it goes anyway: the
# warm-up's own bound ends it first; this bounds a warm-up whose task never ran.
WAIT_SLACK_S = 5.0


def reply_problem(frame: str | bytes, max_bytes: int) -> str | None:
    """What makes `frame` no openpi reply (a text frame: the server's error; undecodable;
    not a map), bounded; None for a reply."""
    if isinstance(frame, str):
        return wire.server_text(frame, "instead of a reply").message
    try:
        reply = codec.unpackb(frame, max_bytes=max_bytes)
    except CodecError as exc:
        return f"reply: {str(exc)[:300]}"
    if not isinstance(reply, dict):
        return f"reply: not a map but {type(reply).__name__}"
    return None


class Warmup:
    """One link's warm-ups (see the module docstring). `phase`: "off" (none yet, or
    warmup_s = 0), "waiting" (armed, not yet sent), "running" (sent, no answer yet),
    "answered", "timed_out", "failed", "skipped"."""

    def __init__(
        self, timeout_s: float, max_bytes: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`timeout_s`: policy.openpi.warmup_s; `max_bytes`: the largest reply decoded."""
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.clock = clock
        self.phase = "off"
        self.since = 0.0  # clock() when armed (running: when sent)
        self.took_s = 0.0  # answered: how long it took; timed_out, failed: how long it ran
        self.reason = ""  # failed or skipped: why
        self._gate: anyio.Event | None = None
        self._failed_at: int | None = None  # acts answered when the server failed the last
        self.closing = False  # set as the link closes: a warm-up cut short is no news

    def arm(self, acts: int) -> anyio.Event | None:
        """A connect was made, `acts` answered so far: the gate holding acts, or None."""
        self.release()  # an earlier connection's warm-up no longer holds anything
        self._gate = None
        if self.timeout_s <= 0:
            return None
        if self._failed_at is not None and self._failed_at == acts:
            self.phase, self.reason = "skipped", "the server failed the last warm-up"
            log.warning(
                "openpi warm-up inference skipped: the server failed the last one and no "
                "act was answered since; acts are served without it"
            )
            return None
        self._failed_at = None
        self._gate = anyio.Event()
        self.phase, self.since, self.reason = "waiting", self.clock(), ""
        return self._gate

    @property
    def holding(self) -> bool:
        """Whether a warm-up holds acts now (armed or sent, not over)."""
        return self._gate is not None and not self._gate.is_set()

    def current(self, gate: anyio.Event) -> bool:
        """Whether `gate` is the last connect's (no later connect armed another)."""
        return gate is self._gate

    def release(self) -> None:
        """Acts are no longer held (the connection the warm-up runs on is gone); what
        became of it is still recorded (`failed`, `end`)."""
        if self._gate is not None:
            self._gate.set()

    def end(self, gate: anyio.Event) -> None:
        """`gate`'s warm-up is over, however it ended: its acts go."""
        gate.set()
        if gate is self._gate and self.phase in ("waiting", "running"):  # cancelled: closing
            self.phase, self.took_s = "failed", self.clock() - self.since
            self.reason = "cancelled"

    async def run(
        self,
        gate: anyio.Event,
        request: Mapping[str, Any],
        exchange: Exchange,
        acts: Callable[[], int],
    ) -> None:
        """`gate`'s warm-up: `request` sent by `exchange` and what became of it logged and
        kept; `acts()`, the acts answered so far. Acts go when it returns, however it
        ended. Never raises (but for cancellation)."""
        try:
            self.sent(gate)
            try:
                frame = await exchange(request, self.timeout_s)
            except CodecError as exc:  # a robot-side bug: nothing sent
                return self.failed(gate, f"the request cannot be encoded: {exc}", acts())
            except (ServerError, ConnectionLost) as exc:
                by_server = isinstance(exc, ServerError)
                reason = f"{type(exc).__name__}: {exc.message}"
                return self.failed(gate, reason, acts(), by_server=by_server)
            if frame is None:
                return self.timed_out(gate)
            problem = reply_problem(frame, self.max_bytes)
            if isinstance(frame, str):  # the server failed it (and closes the connection)
                return self.failed(gate, problem or "", acts(), by_server=True)
            self.answered(gate, problem)
        finally:
            self.end(gate)

    def sent(self, gate: anyio.Event) -> None:
        """`gate`'s request went out (each of these, for a gate no longer current: ignored,
        its connection is gone and the link said why)."""
        if not self.current(gate):
            return
        self.phase, self.since = "running", self.clock()
        log.info(
            "openpi warm-up inference started (shaped as a first act, neutral contents, "
            "its answer discarded; acts wait behind it, at most %g s)",
            self.timeout_s,
        )

    def answered(self, gate: anyio.Event, problem: str | None) -> None:
        """Its reply came (`problem`: what was wrong with it, reply_problem; None: fine)."""
        if not self.current(gate):
            return
        self.phase, self.took_s = "answered", self.clock() - self.since
        if problem is None:
            log.info("openpi warm-up inference answered in %.1f s", self.took_s)
        else:
            log.warning(
                "openpi warm-up inference answered in %.1f s, with no usable reply (dropped): "
                "%.300s",
                self.took_s,
                problem,
            )

    def timed_out(self, gate: anyio.Event) -> None:
        """No reply within warmup_s: acts go now; the link keeps the connection and drops
        the reply when it comes (`late`)."""
        if not self.current(gate):
            return
        self.phase, self.took_s = "timed_out", self.clock() - self.since
        log.warning(
            "openpi warm-up inference not answered within %g s; acts are served now (its "
            "answer is dropped when it comes; the first acts may be as slow as without a "
            "warm-up)",
            self.timeout_s,
        )

    def failed(self, gate: anyio.Event, reason: str, acts: int, *, by_server: bool = False) -> None:
        """It could not be sent or its connection failed (`by_server`: the server failed it:
        the next connect skips the warm-up unless an act is answered first)."""
        if not self.current(gate):
            return
        self.phase, self.took_s = "failed", self.clock() - self.since
        self.reason = reason[:300]
        if by_server:
            self._failed_at = acts
        (log.info if self.closing else log.warning)(  # closing: the daemon stops, no news
            "openpi warm-up inference failed after %.1f s: %s; acts are served anyway",
            self.took_s,
            self.reason,
        )

    def late(self, frame: str | bytes, acts: int) -> None:
        """The reply of a warm-up that timed out came (and was dropped); `acts` answered so
        far. A text frame is the server failing it, late: as `failed(by_server=True)`."""
        problem = reply_problem(frame, self.max_bytes)
        after = self.clock() - self.since
        if isinstance(frame, str):
            self._failed_at = acts
        if problem is None:
            log.info("openpi warm-up inference answered late, after %.1f s (dropped)", after)
        else:
            log.warning(
                "openpi warm-up inference's late reply, after %.1f s, dropped: %.300s",
                after,
                problem,
            )

    async def wait(self) -> None:
        """Until no warm-up holds acts (a gate armed meanwhile, at a reconnect, is waited
        for too), at most warmup_s + WAIT_SLACK_S in all."""
        with anyio.move_on_after(self.timeout_s + WAIT_SLACK_S):
            while self._gate is not None and not self._gate.is_set():
                await self._gate.wait()

    def words(self) -> str:
        """For status: "" when there never was one; else what it does or did."""
        if self.phase in ("waiting", "running"):
            return f"running for {self.clock() - self.since:.1f} s (at most {self.timeout_s:g} s)"
        if self.phase == "answered":
            return f"answered in {self.took_s:.1f} s"
        if self.phase == "timed_out":
            return f"not answered within {self.timeout_s:g} s; acts served without it"
        if self.phase in ("failed", "skipped"):
            return f"{self.phase}: {self.reason}"
        return ""

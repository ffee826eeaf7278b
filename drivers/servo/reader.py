"""One tick's read of every servo: a sync read of one contiguous block, the IDs that
failed read again (a plain SYNC_READ of just those) while the tick's budget lasts, each
failure counted against its joint."""

from __future__ import annotations

import time
from collections.abc import Sequence

from drivers.base import DriverFault, JointCounters
from drivers.servo.bus import Outcome, Reply, ServoBus


class StateReader:
    """Reads `length` bytes at `address` from every ID; see `read`."""

    def __init__(
        self,
        bus: ServoBus,
        ids: Sequence[int],
        names: Sequence[str],
        counters: Sequence[JointCounters],
        block: tuple[int, int],
        *,
        retries: int,
        budget_s: float,
        fast: bool = False,
    ) -> None:
        self.bus = bus
        self.ids = list(ids)
        self.address, self.length = block
        self.retries = retries
        self.budget_ns = int(budget_s * 1e9)
        self.fast = fast
        self._name = dict(zip(ids, names))
        self._counters = dict(zip(ids, counters))

    def read(self) -> dict[int, Reply]:
        """A reply from every ID, or DriverFault naming the joints that failed and why.

        A reply whose error byte says the instruction was refused is retried like a
        timeout; one that reports a condition of the servo (alert, overload) is returned
        with its data: the caller decides what the condition means."""
        start = time.monotonic_ns()
        end = start + self.budget_ns
        pending = list(self.ids)
        got: dict[int, Reply] = {}
        why: dict[int, str] = {}
        fast = self.fast
        attempts = 0
        while pending and attempts <= self.retries:
            now = time.monotonic_ns()
            if now >= end:
                break
            if attempts:
                for i in pending:
                    self._counters[i].retries += 1
            out = self.bus.sync_read(
                self.address, self.length, pending, fast=fast, not_after_ns=end
            )
            self._account(out, pending, got, why, fast)
            pending = [i for i in pending if i not in got]
            attempts += 1
            fast = False  # a failed fast read cannot say who failed: ask each servo
        if pending:
            ms = (time.monotonic_ns() - start) / 1e6
            parts = [f"{self._name[i]} (id {i}): {why.get(i, 'not read')}" for i in pending]
            raise DriverFault(
                f"joint read failed after {attempts} tries in {ms:.1f} ms: " + "; ".join(parts),
                joint=self._name[pending[0]],
            )
        return got

    def _account(
        self,
        out: Outcome,
        asked: list[int],
        got: dict[int, Reply],
        why: dict[int, str],
        fast: bool,
    ) -> None:
        codec = self.bus.codec
        for i, r in out.replies.items():
            if r.error:
                self._counters[i].error_bits += 1
            if codec.retryable(r.error):
                why[i] = codec.describe_error(r.error)
            else:
                got[i] = r
        missing = [i for i in asked if i not in out.replies]
        if fast and missing:
            # one packet carried them all: it was corrupt or it did not come
            kind = "checksum" if out.corrupt else "timeout"
            for i in missing:
                self._count(i, kind, why)
            return
        claimed = [c.ident for c in out.corrupt]
        blamed = {i for i in missing if i in claimed}
        spare = len(claimed) - len(blamed)
        for i in missing:
            # a corrupt frame whose ID byte is itself damaged belongs to a servo that
            # did not answer: the first ones in reply order
            if i not in blamed and spare > 0:
                blamed.add(i)
                spare -= 1
            self._count(i, "checksum" if i in blamed else "timeout", why)

    def _count(self, ident: int, kind: str, why: dict[int, str]) -> None:
        c = self._counters[ident]
        if kind == "checksum":
            c.checksum += 1
            why[ident] = "corrupt reply (checksum)"
        else:
            c.timeouts += 1
            why[ident] = "no reply (timeout)"

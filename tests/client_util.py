"""The daemon's act client against a hand-played worker: what it dropped after a session
of connect, an optional call that times out, and an end_episode answered after the rest."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from robotd.link.client import PolicyClient

TimedOut = Callable[[PolicyClient], Awaitable[object]]


def dropped_after(endpoint: str, timed_out: TimedOut | None = None, timeout_s: float = 10) -> dict:
    """Connect to `endpoint`, make `timed_out(client)` (it must raise TimeoutError), then an
    end_episode (the worker's replies meanwhile come before its answer): the client's
    dropped_replies()."""

    async def main() -> dict[str, int]:
        client = PolicyClient(endpoint, timeout_s=timeout_s)
        try:
            await client.connect()
            if timed_out is not None:
                with pytest.raises(TimeoutError):
                    await timed_out(client)
            await client.end_episode("W")
            return client.dropped_replies()
        finally:
            await client.close()

    return anyio.run(main, backend_options={"use_uvloop": True})

"""The act's rtc field on the wire: the worker hands it to a policy that takes it and to no
other, says so in its hello, and refuses a malformed one naming the field. A real worker
(`serve` in a thread, real ipc sockets) and the daemon's PolicyClient."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from serve_util import serving

from robotd.contract import Actions
from robotd.link.client import Handshake, PolicyClient, PolicyError
from robotd.worker.policy_host import PolicyHost, PolicyLoadError


class Echo:
    """Takes rtc and answers it back: row 0 (delay, prefix rows, rest rows), then both."""

    def infer(self, inputs: Any, *, rtc: dict[str, Any] | None = None) -> np.ndarray:
        if rtc is None:
            return np.full((1, 3), -1.0)
        prefix, rest = rtc["prefix"], rtc["rest"]
        head = [[rtc["delay"], prefix.shape[0], rest.shape[0]]]
        return np.vstack([head, prefix, rest])


class Deaf:
    """Takes no rtc (its catch-all takes the episode id): answers 1 if rtc reached it."""

    def infer(self, inputs: Any, **extra: Any) -> list[list[float]]:
        return [[float("rtc" in extra), 0.0, 0.0]]


class OptedOut:
    actions = Actions(rtc=False)

    def infer(self, inputs: Any, *, rtc: Any = None) -> list[list[float]]:
        return [[0.0 if rtc is None else 1.0] * 3]


class Declared:
    actions = Actions(rtc=True, hz=15.0)

    def infer(self, inputs: Any, **kw: Any) -> list[list[float]]:
        return [[1.0 if "rtc" in kw else 0.0] * 3]


class Undeclarable:
    actions = Actions(rtc=True)

    def infer(self, inputs: Any) -> list[list[float]]:
        return [[0.0] * 3]


RTC = {"delay": 3, "prefix": np.arange(6.0).reshape(2, 3), "rest": np.ones((1, 3))}


@pytest.mark.parametrize(
    ("policy", "takes", "wire", "with_rtc", "without"),
    [
        (Echo, True, {"rtc": True}, 3.0, -1.0),
        (Deaf, False, None, 0.0, 0.0),  # a **kwargs catch-all is not asking for it
        (OptedOut, False, {"rtc": False}, 0.0, 0.0),
        (Declared, True, {"hz": 15.0, "rtc": True}, 1.0, 0.0),
    ],
)
def test_who_is_handed_rtc(
    policy: type, takes: bool, wire: dict | None, with_rtc: float, without: float
) -> None:
    host = PolicyHost.wrap(policy())
    assert host.takes_rtc is takes
    assert host.actions_wire() == wire
    assert host.infer({"x": 1}, "e", rtc=RTC)[0, 0] == with_rtc
    assert host.infer({"x": 1}, "e")[0, 0] == without  # an act without rtc: nothing new


def test_the_worker_hands_rtc_rows_read_only_as_float64() -> None:
    from robotd.worker.requests import rtc_field

    got = rtc_field({"rtc": {**RTC, "prefix": np.arange(6, dtype=np.int32).reshape(2, 3)}})
    assert got is not None and got["delay"] == 3
    for name in ("prefix", "rest"):
        assert got[name].dtype == np.float64 and not got[name].flags.writeable
    assert rtc_field({}) is None


def test_declaring_rtc_without_taking_it_is_a_load_error() -> None:
    with pytest.raises(PolicyLoadError, match="declares Actions\\(rtc=True\\) but infer takes no"):
        PolicyHost.wrap(Undeclarable())


@pytest.fixture(scope="module")
def workers() -> Iterator[dict[str, str]]:
    sockdir = Path(tempfile.mkdtemp(prefix="robotd-rtc-"))  # ipc paths must stay short
    try:
        with contextlib.ExitStack() as workers:
            yield {
                name: workers.enter_context(
                    serving(f"tests.test_rtc_worker:{name}", f"ipc://{sockdir}/{name}.sock")
                )
                for name in ("Echo", "Deaf")
            }
    finally:
        shutil.rmtree(sockdir, ignore_errors=True)


def run(fn: Any) -> Any:
    return anyio.run(fn, backend_options={"use_uvloop": True})


@contextlib.asynccontextmanager
async def connected(endpoint: str) -> AsyncIterator[tuple[PolicyClient, Handshake]]:
    """A client said hello to the worker; closed however the test leaves."""
    client = PolicyClient(endpoint, timeout_s=10)
    try:
        yield client, await client.connect()
    finally:
        await client.close()


def test_served_policy_gets_the_rtc_field_as_sent(workers: dict[str, str]) -> None:
    async def main() -> None:
        async with connected(workers["Echo"]) as (client, hello):
            await served(client, hello)

    async def served(client: PolicyClient, hello: Handshake) -> None:
        assert hello.actions is not None and hello.actions.rtc is True
        got = await client.act("e", 4, [4], [{"x": 1.0}], rtc=RTC)
        np.testing.assert_array_equal(got.actions[0], [3, 2, 1])
        np.testing.assert_array_equal(got.actions[1:3], RTC["prefix"])
        np.testing.assert_array_equal(got.actions[3:], RTC["rest"])
        none = await client.act("e", 5, [5], [{"x": 1.0}])
        assert none.actions[0, 0] == -1.0
        empty = {"delay": 1, "prefix": np.zeros((0, 3)), "rest": np.zeros((0, 3))}
        got = await client.act("e", 6, [6], [{"x": 1.0}], rtc=empty)
        np.testing.assert_array_equal(got.actions, [[1, 0, 0]])

    run(main)


def test_a_policy_without_rtc_sees_nothing_new(workers: dict[str, str]) -> None:
    async def main() -> None:
        async with connected(workers["Deaf"]) as (client, hello):
            assert hello.actions is None
            got = await client.act("e", 4, [4], [{"x": 1.0}], rtc=RTC)
            assert got.actions[0, 0] == 0.0

    run(main)


@pytest.mark.parametrize(
    ("rtc", "needle"),
    [
        ([1, 2], "field 'rtc': need a map"),
        ({"delay": 1, "prefix": np.zeros((0, 3))}, "field 'rtc': need a map"),
        ({**RTC, "extra": 1}, "field 'rtc': need a map"),
        ({**RTC, "delay": 0}, "field 'rtc.delay'"),
        ({**RTC, "delay": True}, "field 'rtc.delay'"),
        ({**RTC, "delay": 1}, "field 'rtc.prefix': 2 rows for a delay of 1"),
        ({**RTC, "prefix": [[0.0, 1.0, 2.0]]}, "field 'rtc.prefix': not a 2-D numeric array"),
        ({**RTC, "rest": np.zeros(3)}, "field 'rtc.rest': not a 2-D numeric array"),
        ({**RTC, "rest": np.zeros((1, 2))}, "prefix rows of 3 values, rest rows of 2"),
        ({**RTC, "rest": np.full((1, 3), np.nan)}, "field 'rtc.rest': holds NaN"),
        ({**RTC, "rest": np.zeros((5000, 3))}, "field 'rtc.rest': shape (5000, 3)"),
    ],
)
def test_a_malformed_rtc_is_refused_naming_the_field(
    workers: dict[str, str], rtc: Any, needle: str
) -> None:
    async def main() -> None:
        async with connected(workers["Echo"]) as (client, _):
            with pytest.raises(PolicyError) as info:
                await client.act("e", 4, [4], [{"x": 1.0}], rtc=rtc)
            assert info.value.code == "bad_request" and needle in info.value.message
            got = await client.act("e", 5, [5], [{"x": 1.0}], rtc=RTC)  # it goes on serving
            assert got.actions[0, 0] == 3

    run(main)

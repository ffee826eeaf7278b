"""What a worker's replies may be, held by the daemon's act client on real ZeroMQ sockets
against hand-played workers: a hello whose contract's integers are out of bounds is refused
naming the field and the bound; a second reply to a request already answered is counted
as a duplicate (not as one naming no request), an undecodable one is counted too, each
logged at most once a while per kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from robotd.contract import MAX_ANSWER_ROWS, Actions, ContractError
from robotd.link.client import PolicyClient, PolicyError
from tests.fake_router import FakeRouter
from tests.test_uplink import sockdir

__all__ = ["sockdir"]  # the fixture used here

WELL = {"protocol": 1, "contract": {}, "endpoints": {}, "policy": "p:W"}


def _run(fn: Any) -> Any:
    return anyio.run(fn, backend_options={"use_uvloop": True})


# ---- hello: the contract's integers are bounded -------------------------------------------


def test_open_loop_horizon_is_bounded_by_the_most_rows_a_chunk_may_have() -> None:
    assert Actions(open_loop_horizon=MAX_ANSWER_ROWS).open_loop_horizon == MAX_ANSWER_ROWS
    for n in (MAX_ANSWER_ROWS + 1, 9 * 10**18, 10**30):
        with pytest.raises(ContractError) as refused:
            Actions.from_wire({"open_loop_horizon": n})
        assert str(refused.value) == (
            f"actions.open_loop_horizon: open_loop_horizon {n} is over 4096, the most rows a "
            "chunk may have"
        )


class _Hello(FakeRouter):
    """Answers hello with `contract`, anything else with an empty result."""

    def __init__(self, endpoint: str, contract: dict[str, Any]) -> None:
        super().__init__(endpoint)
        self.contract = contract

    def reply(self, msg: dict[str, Any]) -> Any:
        result = {**WELL, "contract": self.contract} if msg["cmd"] == "hello" else {}
        return {"id": msg["id"], "ok": True, "result": result}


def test_a_hello_with_an_unbounded_open_loop_horizon_is_refused(sockdir: Path) -> None:
    endpoint = f"ipc://{sockdir}/h.sock"
    fake = _Hello(endpoint, {"actions": {"open_loop_horizon": 9 * 10**18}})
    fake.start()

    async def main() -> PolicyError:
        client = PolicyClient(endpoint, timeout_s=10)
        try:
            with pytest.raises(PolicyError) as refused:
                await client.connect()
            return refused.value
        finally:
            await client.close()

    try:
        error = _run(main)
    finally:
        fake.close()
    assert error.code == "bad_reply", error
    assert error.message == (
        "reply to hello: contract.actions.open_loop_horizon: open_loop_horizon "
        "9000000000000000000 is over 4096, the most rows a chunk may have"
    )

"""Replies on the observe connection that acknowledge no upload waiting for one are said in
words, never as their bytes: the answer to an upload of an episode that ended meanwhile
(what a daemon stopped and continued meets: its episode ended while the answers were on
their way), and whatever else a worker sends. Real ZeroMQ sockets: the daemon's
ObserveConnection against a hand-played worker that holds its answers until told."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from robotd import wire
from robotd.link.observe import ObserveConnection
from robotd.link.posts import stray_words
from robotd.link.steps import LinkCounters
from tests.fake_router import FakeRouter
from tests.test_uplink import run, sockdir

__all__ = ["sockdir"]  # the fixture used here

DEADLINE_S = 30.0  # generous: a loaded 2-core machine
Frames = Callable[[list[dict[str, Any]]], list[bytes]]
LINES = "e\n" * 500  # an episode id of 500 lines: said as one line, cut short


def ack(msg: dict[str, Any], **result: Any) -> dict[str, Any]:
    body = {"episode": msg["episode"], "step": msg["step"], "through": msg["step"]}
    return {"id": msg["id"], "ok": True, "result": {**body, "refused": None, **result}}


class HeldAnswers(FakeRouter):
    """An observe socket that answers nothing until `release` is set; then it sends
    `frames(uploads)` (raw frames, in that order), for the uploads it got meanwhile."""

    def __init__(self, endpoint: str, frames: Frames) -> None:
        super().__init__(endpoint)
        self.frames = frames
        self.release = threading.Event()
        self.uploads: list[dict[str, Any]] = []
        self.start()

    def _serve(self) -> None:
        route = b""
        while not self.stop.is_set():
            if self.release.is_set() and self.uploads:
                for frame in self.frames(self.uploads):
                    self.sock.send_multipart([route, frame])
                self.uploads = []
            if self.sock.poll(20):
                route, body = self.sock.recv_multipart()
                self.uploads.append(wire.unpackb(body))


async def until(ok: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ok():
        assert time.monotonic() < deadline, f"{what}: not within {DEADLINE_S} s"
        await anyio.sleep(0.005)  # polling a condition with a deadline


def test_an_answer_to_an_upload_of_an_ended_episode_is_said_in_words(
    sockdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Repro: "upload unexpected reply: dropped b'\\x83\\xa2id\\x04...' (no upload of that
    id)" after a SIGSTOP/SIGCONT of the daemon. The answer of an upload whose episode ended
    meanwhile is expected (no warning, not counted: every episode that ends with uploads
    in flight meets it); the junk after it is counted (and said in words, once a while), a
    bool id is no upload's id, and the live upload's own answer counts."""

    def frames(uploads: list[dict[str, Any]]) -> list[bytes]:
        live, ended = uploads
        return [
            wire.packb(ack(ended)),
            wire.packb({**ack(live, through=99), "id": True}),  # True is not upload 1
            b"\xc1" * 5000,
            wire.packb([1, 2]),
            wire.packb({"id": "x" * 10_000}),
            wire.packb({"id": 10**6, "ok": True}),
            wire.packb(ack(live)),
        ]

    endpoint = f"ipc://{sockdir}/o.sock"
    fake = HeldAnswers(endpoint, frames)
    counters = LinkCounters()
    conn = ObserveConnection(endpoint, counters)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.run)
            conn.post("V", 3, {"joints.pos": [0.0]}, {}, urgent=True)
            conn.post("W", 7, {"joints.pos": [0.0]}, {}, urgent=True)
            await until(lambda: len(fake.uploads) == 2, "both uploads at the worker")
            conn.end("W")  # the episode ends while its upload's answer is on its way
            fake.release.set()
            await until(lambda: counters.unknown_acks == 5, "every stray reply counted")
            await until(lambda: conn.through("V") == 3, "the live upload's own answer")
            tg.cancel_scope.cancel()

    try:
        with caplog.at_level(logging.WARNING, logger="robotd.link"):
            run(main)
    finally:
        fake.close()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said  # the rest within the next 5 s: counted, said later
    assert said[0].startswith(
        "upload unexpected reply: dropped a reply naming no upload (its id: True; "
    ), said


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (wire.WireError("not a valid msgpack message: bad format byte"),
         "dropped an undecodable reply (5000 bytes: not a valid msgpack message: bad format "
         "byte)"),
        ([1, 2], "dropped a reply that is a list, not a map (5000 bytes)"),
        ({"id": True}, "dropped a reply naming no upload (its id: True; 5000 bytes)"),
        ({"id": "x" * 10_000}, f"dropped a reply naming no upload (its id: '{'x' * 39}; "
                               "5000 bytes)"),
        ({"id": None}, "dropped a reply naming no upload (its id: None; 5000 bytes)"),
        ({"id": 0}, "dropped a reply naming upload 0, which was never sent (5000 bytes)"),
        ({"id": 2**63}, f"dropped a reply naming upload {2**63}, which was never sent "
                        "(5000 bytes)"),
        ({"id": 4, "result": {"episode": "e" * 500, "step": True}},
         "dropped the worker's answer to upload 4: nothing waits for it any more (its episode "
         "ended before the answer came, or it was answered already)"),
        ({"id": 4, "result": {"episode": LINES, "step": 9}},
         f"dropped the worker's answer to upload 4 (of episode {LINES[:64]!r} step 9, it "
         "says): nothing waits for it any more (its episode ended before the answer came, or "
         "it was answered already)"),
    ],
)  # fmt: skip
def test_a_stray_reply_is_one_bounded_sentence(reply: Any, words: str) -> None:
    said = stray_words(reply, 5000, sent=10)
    assert said == words
    assert len(said) < 400 and "\n" not in said

"""The reference worker (`serve`, in a real child process) and the daemon's PolicyClient,
over real ipc endpoints."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import zmq

from robotd import wire
from robotd.contract import Actions, Observations
from robotd.link.client import PolicyClient, PolicyError
from robotd.worker.policy_host import PolicyCallError, PolicyHost, PolicyLoadError
from tests.policy_util import short_dir

ROOT = Path(__file__).resolve().parents[1]

POLICIES = textwrap.dedent('''
    import numpy as np
    from robotd.contract import Actions, Observations, Stream

    class Windowed:
        """Answers rows that show what it was handed and how often its hooks ran."""
        observations = Observations(streams={"x": Stream(at=[-1, 0])})
        actions = Actions(key="rows", hz=10, open_loop_horizon=2)

        def __init__(self, gain: float = 1.0):
            self.gain, self.resets, self.ends = gain, 0, 0

        def reset(self):
            self.resets += 1

        def on_episode_end(self):
            self.ends += 1

        def infer(self, inputs, *, episode=None):
            last = inputs["observations"][-1]
            mode = last.get("mode")
            if mode == "raise":
                raise RuntimeError("boom at step %d" % inputs["steps"][-1])
            if mode == "nan":
                return {"rows": [[float("nan"), 1.0]]}
            if mode == "flat":
                return {"rows": np.zeros(3)}
            if mode == "fifo":  # blocks until the test opens the FIFO for writing
                with open(last["fifo"]) as f:
                    f.read()
            if mode == "nokey":
                return {"other": np.zeros((1, 1))}
            x = float(np.sum(last.get("x", 0)))
            return {"rows": np.array([[inputs["steps"][-1], len(inputs["steps"]), self.resets,
                                       self.ends, x * self.gain]] * 2)}

    class Broken:
        def __init__(self):
            raise RuntimeError("no GPU")

        def infer(self, obs):
            return [[0.0]]

    class Bare:
        """No contract: handed the act's own observation, answers the rows themselves."""
        def infer(self, obs):
            return [[obs["v"], 2.0], [obs["v"], 3.0]]
''')


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run a coroutine function on anyio with uvloop, as the daemon does."""
    return anyio.run(fn, backend_options={"use_uvloop": True})


@pytest.fixture(scope="module")
def sockdir() -> Iterator[Path]:
    yield from short_dir("robotd-w-", {"policies_mod.py": POLICIES})


def _start(
    sockdir: Path, policy: str, name: str, kwargs: dict[str, str], scheme: str = "ipc"
) -> Iterator[str]:
    # A directory that does not exist yet: serve must create it.
    endpoint = f"{scheme}://{sockdir}/{name}/worker.sock"
    code = (
        "import sys; from robotd.worker.server import serve; "
        f"serve({policy!r}, {endpoint!r}, policy_kwargs={kwargs!r})"
    )
    env = {**os.environ, "PYTHONPATH": f"{sockdir}{os.pathsep}{ROOT}"}
    out = sockdir / f"{name}.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        yield endpoint
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert f"listening on {endpoint}" in out.read_text()
        assert proc.returncode == 0, out.read_text()  # SIGTERM: a clean stop
        assert not Path(endpoint.split("://", 1)[1]).exists()


# The act endpoint over ZeroMQ and over robotd's byte stream (robotd.stream): the same
# requests, the same answers.
@pytest.fixture(scope="module", params=["ipc", "stream+ipc"])
def windowed(sockdir: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"win-{request.param.replace('+', '-')}"
    yield from _start(sockdir, "policies_mod:Windowed", name, {"gain": "2.5"}, request.param)


@pytest.fixture(scope="module")
def bare(sockdir: Path) -> Iterator[str]:
    yield from _start(sockdir, "policies_mod:Bare", "bare", {})


def test_hello_returns_the_contract(windowed: str, bare: str) -> None:
    async def main() -> None:
        for endpoint, has_contract in ((windowed, True), (bare, False)):
            client = PolicyClient(endpoint, timeout_s=20)
            hello = await client.connect()
            await client.close()
            if has_contract:
                assert hello.observations == Observations.from_wire(
                    {"streams": {"x": {"at": [-1, 0]}}}
                )
                assert hello.actions == Actions(key="rows", hz=10, open_loop_horizon=2)
                assert hello.policy == "policies_mod:Windowed"
            else:
                assert hello.observations is None and hello.actions is None
            assert hello.endpoints == {"observe": None}

    run(main)


def test_act_returns_the_chunk_and_calls_the_hooks(windowed: str) -> None:
    async def main() -> None:
        client = PolicyClient(windowed, timeout_s=20)
        await client.connect()
        obs = [{"x": np.array([1.0, 2.0])}, {"x": np.array([3.0, 4.0])}]
        first = await client.act("L1", 4, [3, 4], obs)
        assert first.step == 4 and first.episode == "L1"
        assert first.actions.shape == (2, 5) and first.actions.dtype == np.float64
        step, n_steps, resets, ends, x = first.actions[0]
        assert (step, n_steps, x) == (4, 2, 7.0 * 2.5)  # gain "2.5" came in as a string
        assert first.infer_ms >= 0 and first.rtt_ms >= first.infer_ms
        again = await client.act("L1", 5, [4, 5], obs)
        assert tuple(again.actions[0, 2:4]) == (resets, ends)  # same episode: no reset
        await client.end_episode("L1")
        second = await client.act("L2", 0, [-1, 0], obs)
        assert tuple(second.actions[0, 2:4]) == (resets + 1, ends + 1)
        third = await client.act("L3", 0, [0], obs[:1])  # L2 never ended: ends now
        assert tuple(third.actions[0, 2:4]) == (resets + 2, ends + 2)
        with pytest.raises(PolicyError) as err:
            await client.act("L1", 6, [6], obs[:1])
        assert err.value.code == "episode_ended" and "L1" in err.value.message
        await client.close()

    run(main)


def test_policy_without_contract_gets_its_own_observation(bare: str) -> None:
    async def main() -> None:
        client = PolicyClient(bare, timeout_s=20)
        await client.connect()
        result = await client.act("B1", 9, [9], [{"v": 1.5}])
        np.testing.assert_array_equal(result.actions, [[1.5, 2.0], [1.5, 3.0]])
        with pytest.raises(PolicyError, match="steps") as err:
            await client.act("B1", 10, [9, 10], [{"v": 1}, {"v": 2}])
        assert err.value.code == "bad_request"
        await client.close()

    run(main)


@pytest.mark.parametrize(
    ("mode", "code", "needle"),
    [
        ("raise", "policy_error", "RuntimeError: boom at step 1"),
        ("nan", "bad_actions", "row 0 column 0 is nan"),
        ("flat", "bad_actions", "not 2-D"),
        ("nokey", "bad_actions", "no field 'rows'"),
    ],
)
def test_policy_failures_are_error_replies(
    windowed: str, mode: str, code: str, needle: str
) -> None:
    async def main() -> None:
        client = PolicyClient(windowed, timeout_s=20)
        await client.connect()
        with pytest.raises(PolicyError) as err:
            await client.act(f"F-{mode}", 1, [1], [{"mode": mode}])
        assert err.value.code == code and needle in err.value.message
        ok = await client.act(f"F-{mode}", 2, [2], [{"x": 1.0}])  # still serving
        assert ok.step == 2
        await client.close()

    run(main)


def _dial_unix(path: str, deadline_s: float) -> socket.socket:
    """Connect to a Unix stream socket that a worker starting up may not have bound yet
    (a ZeroMQ DEALER waits for it by itself; a plain socket must dial again)."""
    deadline = time.monotonic() + deadline_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(20)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # polling a path that appears when the worker binds it


class RawPeer:
    """One-frame requests to an act endpoint, ZeroMQ or stream, with no robotd client code
    in the way (a stream peer frames them by hand, as docs/protocol.md says)."""

    def __init__(self, endpoint: str) -> None:
        self.ctx: zmq.Context | None = None
        if endpoint.startswith("stream+ipc://"):
            self.raw = _dial_unix(endpoint.removeprefix("stream+ipc://"), deadline_s=20)
        else:
            self.ctx = zmq.Context()
            self.sock = self.ctx.socket(zmq.DEALER)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.connect(endpoint)

    def request(self, body: bytes) -> dict[str, Any]:
        if self.ctx is None:
            self.raw.sendall(struct.pack("<IQ", 1, len(body)) + body)
            (count,) = struct.unpack("<I", _exactly(self.raw, 4))
            lengths = struct.unpack(f"<{count}Q", _exactly(self.raw, 8 * count))
            frames = [_exactly(self.raw, n) for n in lengths]
            assert count == 1, f"a one-frame request got {count} frames back"
            return wire.unpackb(frames[0])
        self.sock.send(body)
        assert self.sock.poll(20_000), "worker did not answer"
        return wire.unpackb(self.sock.recv())

    def close(self) -> None:
        if self.ctx is None:
            self.raw.close()
        else:
            self.sock.close()
            self.ctx.term()


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        assert part, "the worker closed the stream"
        data += part
    return data


_LEFT_OUT = object()  # a field _act_request leaves out of the request


def _act_request(**fields: Any) -> bytes:
    """The bytes of an act request: id 1, episode "M", step 2 over steps 1 and 2, with
    `fields` in place of those (in the same order on the wire); a field set to _LEFT_OUT is
    not sent at all. The default is well formed: each case breaks one rule."""
    base = {"id": 1, "cmd": "act", "episode": "M", "step": 2, "steps": [1, 2]}
    request = {**base, "observations": [{}, {}], **fields}
    return wire.packb({k: v for k, v in request.items() if v is not _LEFT_OUT})


@pytest.mark.parametrize(
    ("body", "code", "needle"),
    [
        (b"\xc1garbage", "bad_request", "not msgpack"),
        (wire.packb([1, 2]), "bad_request", "must be a map"),
        (wire.packb({"id": "x", "cmd": "hello"}), "bad_request", "field 'id'"),
        (wire.packb({"id": 1, "cmd": "fly"}), "unknown_command", "'fly'"),
        (wire.packb({"id": 1}), "bad_request", "field 'cmd'"),
        (_act_request(step=_LEFT_OUT, steps=[0], observations=[{}]), "bad_request", "field 'step'"),
        (_act_request(observations=[{}]), "bad_request", "field 'observations'"),
        (_act_request(steps=[2, 1]), "bad_request", "strictly ascending"),
        (_act_request(step=3), "bad_request", "act's own step"),
        (
            _act_request(episode=5, step=0, steps=[0], observations=[{}]),
            "bad_request",
            "field 'episode'",
        ),
        (wire.packb({"id": 1, "cmd": "end_episode"}), "bad_request", "field 'episode'"),
    ],
)
def test_malformed_requests_get_error_replies(
    windowed: str, body: bytes, code: str, needle: str
) -> None:
    peer = RawPeer(windowed)
    try:
        reply = peer.request(body)
        assert reply["ok"] is False
        assert reply["error"]["code"] == code and needle in reply["error"]["message"]
        answer = peer.request(_act_request(id=42, step=3, steps=[3], observations=[{"x": 2.0}]))
        assert answer["id"] == 42 and answer["ok"] is True
        assert answer["result"]["actions"].shape == (2, 5)
    finally:
        peer.close()


def test_acts_in_flight_are_matched_by_id(windowed: str) -> None:
    async def main() -> None:
        client = PolicyClient(windowed, timeout_s=20)
        await client.connect()
        got: dict[int, float] = {}

        async def one(step: int) -> None:
            result = await client.act("C1", step, [step], [{"x": float(step)}])
            assert result.step == step
            got[step] = result.actions[0, 4]

        async with anyio.create_task_group() as tg:
            for step in range(6):
                tg.start_soon(one, step)
        assert got == {s: s * 2.5 for s in range(6)}
        await client.close()

    run(main)


def test_socket_answers_while_the_policy_computes(windowed: str, sockdir: Path) -> None:
    fifo = sockdir / f"gate-{Path(windowed).parent.name}.fifo"  # one per transport
    os.mkfifo(fifo)

    async def main() -> None:
        client = PolicyClient(windowed, timeout_s=20)
        await client.connect()
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:

                async def slow_act() -> None:
                    result = await client.act("S1", 1, [1], [{"mode": "fifo", "fifo": str(fifo)}])
                    assert result.step == 1

                tg.start_soon(slow_act)
                # Opening for writing returns once the policy has opened it: infer is running.
                gate = await anyio.to_thread.run_sync(open, fifo, "w")
                other = PolicyClient(windowed, timeout_s=20)
                assert (await other.connect()).policy == "policies_mod:Windowed"
                with pytest.raises(PolicyError, match="unknown command"):
                    await other._request({"cmd": "nope"}, 20)
                await other.close()
                gate.close()  # lets infer finish
        await client.close()

    run(main)


class _FakeWorker:
    """A real ROUTER in a thread; `answer(request)` gives the replies to send back, in order
    (an empty list: no answer)."""

    def __init__(self, endpoint: str, answer: Callable[[dict], list[dict]]) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.answer = answer
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(20):
                continue
            route, body = self.sock.recv_multipart()
            for reply in self.answer(wire.unpackb(body)):
                self.sock.send_multipart([route, wire.packb(reply)])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()
        self.ctx.term()

    def __enter__(self) -> _FakeWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # whatever the test body raised: a bound socket must not outlive it


def _hello_reply(req: dict) -> dict:
    return {
        "id": req["id"],
        "ok": True,
        "result": {
            "protocol": 1,
            "contract": {"observations": None, "actions": None},
            "endpoints": {"observe": None},
            "policy": "fake:P",
        },
    }


def _act_reply(req: dict, value: float) -> dict:
    return {
        "id": req["id"],
        "ok": True,
        "result": {
            "actions": np.full((2, 3), value),
            "timing": {"infer_ms": 1.0, "queue_ms": 0.0},
            "step": req["step"],
            "episode": req["episode"],
        },
    }


def test_timeout_against_a_worker_that_never_answers(sockdir: Path) -> None:
    fake = _FakeWorker(f"ipc://{sockdir}/silent.sock", lambda req: [])

    async def main() -> None:
        client = PolicyClient(f"ipc://{sockdir}/silent.sock", timeout_s=0.3)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await client.connect()
        with pytest.raises(TimeoutError):
            await client.act("T", 0, [0], [{}], timeout_s=0.2)
        assert time.monotonic() - started < 5  # bounded by the timeouts, not hung
        await client.close()
        nobody = PolicyClient(f"ipc://{sockdir}/nobody.sock", timeout_s=0.2)
        with pytest.raises(TimeoutError):
            await nobody.connect()
        await nobody.close()

    with fake:
        run(main)


def test_close_fails_requests_still_waiting(sockdir: Path) -> None:
    endpoint = f"ipc://{sockdir}/closing.sock"
    fake = _FakeWorker(endpoint, lambda req: [_hello_reply(req)] if req["cmd"] == "hello" else [])

    async def main() -> None:
        client = PolicyClient(endpoint, timeout_s=20)
        await client.connect()
        codes: list[str] = []

        async def waiting(step: int) -> None:
            with pytest.raises(PolicyError) as err:
                await client.act("W", step, [step], [{}])
            codes.append(err.value.code)

        with anyio.fail_after(10):  # not the 20 s request timeout: close ends the waits
            async with anyio.create_task_group() as tg:
                for step in range(3):
                    tg.start_soon(waiting, step)
                await anyio.wait_all_tasks_blocked()
                await client.close()
        assert codes == ["closed"] * 3
        with pytest.raises(PolicyError, match="not connected"):
            await client.end_episode("W")

    with fake:
        run(main)


def test_late_reply_is_dropped_and_the_next_one_matched(sockdir: Path) -> None:
    held: list[dict] = []

    def answer(req: dict) -> list[dict]:
        if req["cmd"] == "hello":
            return [_hello_reply(req)]
        if req["step"] == 0:  # hold the first act's reply, send it just before the second's
            held.append(req)
            return []
        return [_act_reply(held.pop(), 0.0), _act_reply(req, 1.0)]

    endpoint = f"ipc://{sockdir}/late.sock"
    fake = _FakeWorker(endpoint, answer)

    async def main() -> None:
        client = PolicyClient(endpoint, timeout_s=5)
        assert (await client.connect()).policy == "fake:P"
        with pytest.raises(TimeoutError):
            await client.act("E", 0, [0], [{}], timeout_s=0.2)
        result = await client.act("E", 1, [1], [{}])
        assert result.step == 1 and result.actions[0, 0] == 1.0
        await client.close()

    with fake:
        run(main)


@pytest.mark.parametrize(
    ("reply", "needle"),
    [
        (
            {
                "ok": True,
                "result": {"actions": np.zeros(3), "step": 1, "episode": "E", "timing": {}},
            },
            "field 'actions'",
        ),
        (
            {
                "ok": True,
                "result": {"actions": np.zeros((1, 2)), "step": 7, "episode": "E", "timing": {}},
            },
            "field 'step'",
        ),
        (
            {
                "ok": True,
                "result": {
                    "actions": np.zeros((1, 2)),
                    "step": 1,
                    "episode": "E",
                    "timing": {"infer_ms": "slow"},
                },
            },
            "field 'timing.infer_ms'",
        ),
        ({"ok": "yes"}, "field 'ok'"),
        ({"ok": False, "error": "bad"}, "field 'error'"),
    ],
)
def test_malformed_act_reply_names_the_field(sockdir: Path, reply: dict, needle: str) -> None:
    endpoint = f"ipc://{sockdir}/badact.sock"

    def answer(req: dict) -> list[dict]:
        return [_hello_reply(req) if req["cmd"] == "hello" else {"id": req["id"], **reply}]

    fake = _FakeWorker(endpoint, answer)

    async def main() -> None:
        client = PolicyClient(endpoint, timeout_s=5)
        await client.connect()
        with pytest.raises(PolicyError) as err:
            await client.act("E", 1, [1], [{}])
        assert err.value.code == "bad_reply" and needle in err.value.message
        await client.close()

    with fake:
        run(main)


def test_an_act_shaped_reply_to_a_ping_is_read_as_a_ping_reply(sockdir: Path) -> None:
    """Act replies are decoded typed first (robotd.link.replies.decode_act_reply): that
    must never hand a typed act result to a caller that asked something else."""
    endpoint = f"ipc://{sockdir}/actping.sock"
    shaped = {"actions": np.zeros((2, 3)), "step": 1, "episode": "E", "timing": {}}

    def answer(req: dict) -> list[dict]:
        if req["cmd"] == "hello":
            return [_hello_reply(req)]
        return [{"id": req["id"], "ok": True, "result": shaped}]

    fake = _FakeWorker(endpoint, answer)

    async def main() -> None:
        client = PolicyClient(endpoint, timeout_s=5)
        await client.connect()
        got = await client.ping(timeout_s=5)
        assert isinstance(got, dict) and got["step"] == 1 and got["actions"].shape == (2, 3)
        chunk = await client.act("E", 1, [1], [{}])  # and the same bytes answer an act
        assert chunk.actions.shape == (2, 3) and chunk.step == 1
        await client.close()

    with fake:
        run(main)


@pytest.mark.parametrize(
    ("result", "needle"),
    [
        ({"protocol": 3}, "field 'protocol'"),  # 1 and 2 are spoken
        (
            {
                "protocol": 1,
                "contract": {"observations": {"streams": {"x": {"at": [3]}}}, "actions": None},
                "endpoints": {},
                "policy": "p",
            },
            "contract.observations.streams['x'].at",
        ),
        (
            {
                "protocol": 1,
                "contract": {"observations": None, "actions": None},
                "endpoints": {"observe": 3},
                "policy": "p",
            },
            "field 'endpoints'",
        ),
        (
            {
                "protocol": 1,
                "contract": {"observations": None, "actions": None},
                "endpoints": {},
                "policy": None,
            },
            "field 'policy'",
        ),
    ],
)
def test_malformed_hello_reply_names_the_field(sockdir: Path, result: dict, needle: str) -> None:
    endpoint = f"ipc://{sockdir}/badhello.sock"
    fake = _FakeWorker(endpoint, lambda req: [{"id": req["id"], "ok": True, "result": result}])

    async def main() -> None:
        client = PolicyClient(endpoint, timeout_s=5)
        with pytest.raises(PolicyError) as err:
            await client.connect()
        assert err.value.code == "bad_reply" and needle in err.value.message
        await client.close()

    with fake:
        run(main)


@pytest.mark.parametrize(
    ("spec", "kwargs", "needle"),
    [
        ("policies_mod", {}, "expected MODULE:CLASS"),
        ("no_such_mod_xyz:P", {}, "cannot import module 'no_such_mod_xyz'"),
        ("policies_mod:Nope", {}, "has no attribute 'Nope'"),
        ("policies_mod:np", {}, "is not a class"),
        ("policies_mod:Windowed", {"gian": "1"}, "unknown argument 'gian' (takes: gain)"),
        ("policies_mod:Windowed", {"gain": "fast"}, "argument 'gain': 'fast' is not float"),
        ("policies_mod:Broken", {}, "constructor failed: RuntimeError: no GPU"),
    ],
)
def test_policy_load_errors_name_the_problem(
    sockdir: Path, monkeypatch: pytest.MonkeyPatch, spec: str, kwargs: dict, needle: str
) -> None:
    monkeypatch.syspath_prepend(str(sockdir))
    with pytest.raises(PolicyLoadError) as err:
        PolicyHost(spec, kwargs)
    assert needle in str(err.value)


def test_failed_reset_is_retried_and_episodes_bookkept(
    sockdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(sockdir))
    host = PolicyHost("policies_mod:Windowed", {"gain": "2"})
    assert host.policy.gain == 2.0
    failures = iter([True, False])

    def flaky_reset() -> None:
        if next(failures):
            raise OSError("camera busy")
        host.policy.resets += 1

    host.policy.reset = flaky_reset
    with pytest.raises(PolicyCallError) as err:
        host.begin("R1")
    assert err.value.code == "policy_error" and "reset() raised OSError: camera busy" in str(
        err.value
    )
    host.begin("R1")  # tried again, now it works
    host.begin("R1")  # same episode: no second reset
    assert host.policy.resets == 1 and host.current == "R1"
    host.end_episode("R1")
    assert host.policy.ends == 1 and host.current is None
    with pytest.raises(PolicyCallError, match="has ended"):
        host.begin("R1")

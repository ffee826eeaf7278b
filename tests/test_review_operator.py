"""Review mends, each as an operator or an attacker on the control socket finds it:

- what a client sends never reaches the terminal of whoever reads the trace
  (`robotd trace show` of a session holding a params request with escape sequences);
- a cause the lane latches again and again after the first (a flaky bus: a driver fault, a
  good read, a driver fault...) is logged bounded, like driver_error, while every e-stop
  that comes later is still logged;
- a copy of the policy that is lost at once after it became ready (a policy that crashes on
  every act) is replaced ever more rarely, not as fast as copies can start.

Real daemons, workers and copy processes where the defect lived in them; the waits are on
log lines and replies with generous deadlines, never sleeps."""

from __future__ import annotations

import logging
import re

import msgpack
import pytest
import zmq

from robotd.cli import main as robotd_main
from robotd.config import load_config
from robotd.lane.messages import Event
from robotd.runtime.events import QUIET_S, EventLog
from robotd.runtime.summary import RunSummary
from tests.copy_util import Worker, wait_for
from tests.daemon_util import Daemon
from tests.test_fault_first import Rig

ESC_KEY = "\x1b]0;PWNED\x07\x1b[2J"  # retitle the terminal, clear the screen


def _raw(endpoint: str, request: dict) -> dict:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send(msgpack.packb(request, use_bin_type=True))
        assert sock.poll(30_000), "no reply"
        return msgpack.unpackb(sock.recv(), raw=False)
    finally:
        sock.close()


def test_trace_show_prints_no_control_character_a_client_sent(tmp_path, capsys) -> None:
    d = Daemon(tmp_path, "--set", 'robot.start="latched"')  # no episode: the session file
    d.wait_line(r"operator socket")
    reply = _raw(d.control_endpoint, {"id": 1, "cmd": "params", "args": {"set": {ESC_KEY: 1}}})
    assert reply["ok"] is False and ESC_KEY in reply["error"]["message"], reply  # as refused
    reply = _raw(d.control_endpoint, {"id": 2, "cmd": "estop", "args": {"reason": "\x9b2J"}})
    assert reply["ok"] is True, reply
    d.signal()
    assert d.wait_exit() == 0
    (run,) = [p for p in d.traces.iterdir() if p.is_dir()]
    for flags in ((), ("--all",)):
        assert robotd_main(["trace", "show", str(run / "session.mcap"), *flags]) == 0
        out = capsys.readouterr().out
        assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f]", out), repr(out[-2000:])
        line = next(x for x in out.splitlines() if "operator params" in x)
        assert "error: bad_params:" in line and "set.\\x1b]0;PWNED\\x07\\x1b[2J" in line, line


def _logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("fault ")]


def test_a_flapping_driver_after_the_first_fault_is_logged_bounded(caplog) -> None:
    rig = Rig("safety.driver_fault_run=3", "safety.estop_category=1")
    sent: list[Event] = []  # the lane's events as the main process receives them
    rig.k.emit = lambda m: sent.append(m) if isinstance(m, Event) else None
    rig.k.set_contract(4)
    rig.tick()
    rig.k.command("estop", "first press")
    for _ in range(40):  # the bus fails three reads, answers one, fails again...
        for _ in range(3):
            rig.tick(joints=False)
        rig.tick()
    rig.k.command("estop", "second press")
    rig.k.command("estop", "third press")
    events = [e for e in sent if e.name == "fault"]
    assert len(events) == 43  # the lane says each one (the trace keeps them all)
    caplog.set_level(logging.INFO, "robotd")
    cfg = load_config(None, [])
    log = EventLog(cfg.control, RunSummary(cfg.control.hz), lambda _wep: None)
    for ev in events:  # all of them well within QUIET_S
        log.on_event(ev)
    lines = _logged(caplog)
    assert len(lines) == 4, lines  # the first, one driver line, and both later e-stops
    assert "'first press'" in lines[0] and "'after'" not in lines[0]
    assert "'cause': 'driver'" in lines[1] and "'later': 1" in lines[1]
    assert "'second press'" in lines[2] and "'third press'" in lines[3]
    assert QUIET_S >= 5  # the driver's next line says how many came meanwhile


def _crash(worker: Worker, episode: str) -> None:
    reply = worker.client.request({"cmd": "act", "episode": episode, "step": 0, "steps": [0],
                                   "observations": [{"mode": "exit"}]})
    assert reply["ok"] is False and reply["error"]["code"] == "episode_lost", reply


def test_a_copy_lost_at_once_after_it_was_ready_is_replaced_with_backoff() -> None:
    worker = Worker("copy_policies:Faulty", "--copies", "1", "--hang-s", "60")
    try:
        said = re.compile(r"copy (\d+) \(pid \d+\) lost [\d.]+ s after it was ready: "
                          r"the next starts in (\d+) s")
        for n, delay in enumerate((1, 2, 4), start=1):
            worker.wait_ready(1)
            _crash(worker, f"X{n}")
            lines = wait_for(lambda n=n: len(found := said.findall(worker.text())) >= n
                             and found, f"the loss of copy {n} logged")
            assert lines[-1] == (str(n), str(delay)), worker.text()[-3000:]
        health = worker.wait_ready(1)
        assert health["counts"]["copies_started"] == 4, health  # no storm meanwhile
    finally:
        worker.stop()


class _Told:
    """The copies' events, as the pool would be told them (recorded)."""

    def __init__(self) -> None:
        self.lost: list[tuple[int, str]] = []

    def copy_ready(self, slot) -> None:
        pass

    def copy_lost(self, slot, loss, now: float) -> None:
        self.lost.append((slot.id, loss.kind))

    def no_copy(self, why: str) -> None:
        pass


def test_a_copy_lost_after_serving_long_is_logged_with_why_and_replaced(caplog) -> None:
    import time

    from robotd.worker import copies
    from robotd.worker.death import Loss
    from robotd.worker.slots import CopyOptions

    told = _Told()  # an inline copy: the real policy loaded in this process, no child to kill
    c = copies.Copies("robotd.demo:DotFollower", {}, CopyOptions(copies=0, inline=True), told)
    c.start()
    try:
        (slot,) = c.slots.values()
        slot.state, slot.ready_at = "ready", time.monotonic() - copies.STABLE_S - 5
        with caplog.at_level(logging.WARNING, logger="robotd.worker"):
            c.lose(slot, Loss("crashed", "crashed: exit code 3"), time.monotonic())
        assert told.lost == [(1, "crashed")]
        said = r"copy 1 \(pid \d+\) lost after 3\d s serving: a new copy starts now " \
               r"\(crashed: exit code 3\)"
        assert re.search(said, caplog.text), caplog.text
        assert len(c.slots) == 1 and c.counts["copies_started"] == 2  # replaced at once
    finally:
        c.stop()


def test_losses_farther_apart_than_stable_s_start_the_backoff_over() -> None:
    from robotd.worker import copies

    c = copies.Copies.__new__(copies.Copies)  # the backoff's bookkeeping alone
    c._backoff, c._failed_at, c._backoff_until = copies.Backoff(max_s=30.0), -1e9, 0.0
    assert [c._failed(t) for t in (0.0, 1.5, 4.0, 9.0)] == [1, 2, 4, 8]
    # a copy started after 8 s and served a full STABLE_S before the next failure
    assert c._failed(9.0 + 8 + copies.STABLE_S + 0.5) == 1
    # a crash at once after each (capped) wait keeps the delay where it is
    t = 100.0
    for _ in range(8):
        t += c._failed(t) + 0.5
    assert c._backoff.delay_s == 30.0


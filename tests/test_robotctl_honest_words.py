"""robotctl's honesty without a daemon: any e-stop reason goes out sendable, bad arguments
are usage errors naming themselves, a request sent but unanswered may still act, nothing
off the wire reaches the terminal as a control code, every fault cause has words."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from robotd import wire
from robotd.operator import humane, robotctl, robotctl_args, robotctl_estop
from robotd.operator.client import Unreachable
from robotd.operator.locate import Target
from robotd.operator.requests import MAX_TEXT, parse_request
from robotd.operator.words import CAUSES, fault_words, printable, state_words

REPO = Path(__file__).resolve().parent.parent
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # every control code but our own \n
NASTY = "\x1b]0;PWNED\x07\x1b[2J\x9b31m\x7f\x00"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = robotctl.main(list(argv))
    except SystemExit as exc:  # argparse's own usage errors end the process
        code = exc.code
    got = capsys.readouterr()
    return code, got.out, got.err


@pytest.fixture
def silent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A control socket that takes requests and never answers."""
    endpoint = f"ipc://{tmp_path}/control.sock"
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    monkeypatch.setenv("ROBOTD_ENDPOINT", endpoint)
    yield endpoint
    sock.close()


@pytest.mark.parametrize("reason", ["\udcff stop now", "x" * 201, "\udcfe" * 5000])
def test_any_estop_reason_is_made_sendable_within_the_limit(reason: str) -> None:
    clean = robotctl_args.estop_reason(reason)
    assert len(clean) <= MAX_TEXT["reason"] and "\udcff" not in clean
    frame = wire.packb({"id": 1, "cmd": "estop", "args": {"reason": clean}})
    assert parse_request(frame).args == {"reason": clean}  # the daemon takes it as it is
    assert robotctl_args.estop_reason("\udcff stop now") == "\ufffd stop now"


def test_the_estop_sends_a_clean_reason_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, Any]] = []

    def main_process(endpoint: str, cmd: str, args: dict[str, Any], **_: Any) -> dict:
        sent.append(("main", args["reason"]))
        wire.packb(args)  # what the client would do: it must not refuse to pack it
        raise Unreachable("no reply")

    def lane(endpoint: str, reason: str, timeout_s: float) -> dict[str, Any]:
        sent.append(("lane", reason))
        return {"state": "FAULT", "via": "lane.sock"}

    monkeypatch.setattr(robotctl_estop, "request_once", main_process)
    monkeypatch.setattr(robotctl_estop, "estop_via_lane", lane)
    target = Target("ipc:///nowhere/control.sock", "ipc:///nowhere/telemetry.sock")
    status, _ = robotctl_estop.estop(target, "\udcff" + "y" * 300, 1.0)
    assert status == "ok"
    assert [path for path, _ in sent] == ["main", "lane"]
    for _, reason in sent:
        assert reason.startswith("\ufffdy") and len(reason) == MAX_TEXT["reason"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["start", "--task", "\udcffpick"], "--task"),
        (["start", "--task", "t" * (MAX_TEXT["task"] + 1)], "--task"),
        (["verdict", "--success", "--notes", "ok\udcff"], "--notes"),
        (["params", "set", "temp=\udcff"], "params set 'temp'"),
        (["params", "set", "when=1979-05-27T07:32:00Z"], "params set 'when'"),
    ],
)
def test_unsendable_text_is_a_usage_error_naming_it(capsys, silent, argv, named) -> None:
    code, _, err = _run(capsys, *argv)
    assert code == robotctl.EXIT_USAGE and named in err
    assert "cannot pack" not in err and "usage: usage" not in err


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "-inf", "soon"])
def test_timeout_must_be_positive_and_finite(capsys, silent, value: str) -> None:
    code, _, err = _run(capsys, "status", "--timeout", value)
    assert code == robotctl.EXIT_USAGE and "--timeout" in err
    assert "convert" not in err and "Traceback" not in err


def test_no_reply_to_a_sent_command_says_it_may_still_act(capsys, silent) -> None:
    code, _, err = _run(capsys, "stop", "--timeout", "0.2")
    assert code == robotctl.EXIT_UNREACHABLE
    assert "may still take effect" in err and "robotctl status" in err
    # a start reaching the lane after robotctl gave up is refused (expired): said so
    code, _, err = _run(capsys, "start", "--timeout", "0.2")
    assert code == robotctl.EXIT_UNREACHABLE
    assert "the start is not carried out if it reaches the control lane from now on" in err
    assert "robotctl status" in err
    code, _, err = _run(capsys, "status", "--timeout", "0.2")  # asks only: nothing to take effect
    assert code == robotctl.EXIT_UNREACHABLE and "may still" not in err


def test_endpoint_without_a_path_says_so(capsys) -> None:
    code, _, err = _run(capsys, "status", "--endpoint", "ipc://")
    assert code == robotctl.EXIT_USAGE and "no socket path" in err
    assert "PosixPath" not in err and "usage: usage" not in err


def test_params_with_an_assignment_but_no_set_says_how(capsys, silent) -> None:
    code, _, err = _run(capsys, "params", "foo=1")
    assert code == robotctl.EXIT_USAGE
    assert "say: robotctl params set KEY=VALUE" in err and "invalid choice" not in err


def test_errors_are_said_once_without_doubled_prefixes(capsys) -> None:
    out = robotctl.Output(False)
    out.error("params", "bad_params", "params: field 'temp' must be float", 1)
    out.error("usage", "usage", "start --task: not UTF-8 text", 64)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "robotctl: params: bad_params: field 'temp' must be float",
        "robotctl: usage: start --task: not UTF-8 text",
    ]
    robotctl.Output(True).error("params", "bad_params", "params: " + NASTY, 1)
    said = json.loads(capsys.readouterr().out)  # --json: the message exactly as it came
    assert said["error"]["message"] == "params: " + NASTY


def _state(detail: str) -> dict[str, Any]:
    link = {"link": "robotd", "state": "gone", "for_s": 2.0, "reason": NASTY, "endpoint": NASTY}
    return {
        "state": "FAULT",
        "fault": {"cause": "estop", "detail": detail, "active": False},
        "queue": 0,
        "torque": False,
        "link": link,
        "run_id": NASTY,
        "robot": NASTY,
    }


def test_nothing_off_the_wire_reaches_the_terminal_raw() -> None:
    said = [
        humane.result("status", _state(NASTY)),
        humane.result("stats", {NASTY: NASTY, "list": [NASTY] * 20, "n": {"k": NASTY}}),
        humane.result("verdict", {"episode": 1, "success": True, "notes": NASTY}),
        humane.result("params", NASTY),
        fault_words({"cause": NASTY, "detail": NASTY}),
        state_words({"state": NASTY}),
    ]
    for text in said:
        assert not CONTROL.search(text), repr(text)
    assert "\\x1b]0;PWNED" in said[0]  # shown, visibly, not dropped
    assert printable("a\tb\nc\x85") == "a\\x09b\\x0ac\\x85"


def test_status_prints_only_what_is_set_and_readably() -> None:
    link = {"link": "robotd", "endpoint": "stream+ipc:///r/w.sock", "state": "up", "for_s": 4.0,
            "reason": "", "reconnects": 0, "worker_gone_s": 0.0, "policy": "demo:P"}  # fmt: skip
    line = humane.link_words(link)
    assert line == "up for 4 s, policy demo:P, worker stream+ipc:///r/w.sock"
    gone = {**link, "state": "gone", "reason": "refused", "reconnects": 2, "worker_gone_s": 7.5}
    assert humane.link_words(gone).startswith("gone for 4 s: refused, policy demo:P")
    assert "2 reconnects" in humane.link_words(gone)
    refused = {**gone, "not_back": "its contract cannot be used: actions.hz 0.0001"}
    assert humane.link_words(refused).startswith(
        "gone for 4 s: refused, not back: its contract cannot be used: actions.hz 0.0001, "
        "policy demo:P"
    )
    status = humane.status({"state": "RUNNING", "link": link})
    assert "link     up for 4 s" in status and "link link" not in status


def _emitted_causes() -> set[str]:
    """Every cause the control lane latches a fault with, read from its source."""
    found: set[str] = set()
    for path in (REPO / "robotd" / "control").glob("*.py"):
        text = path.read_text()
        found |= set(re.findall(r"\.fault\(\s*\"(\w+)\"", text))
        found |= set(re.findall(r"\bFault\(\s*\"(\w+)\"", text))
    return found


def test_every_fault_cause_the_lane_emits_has_words() -> None:
    emitted = _emitted_causes()
    assert {"estop", "main_gone", "startup"} <= emitted  # the scan finds them
    assert set(CAUSES) == emitted
    gone = fault_words({"cause": "main_gone", "detail": "the main process is gone"})
    assert gone.startswith("control lane lost its main process")


def test_a_state_waiting_on_reset_done_says_so() -> None:
    for name in ("ENDED", "RESETTING"):
        words = state_words({"state": name, "episode": 2, "outcome": "starved"})
        assert words == f"{name} episode 2 (starved) — reset_done when the robot is back at " \
                        "the start", words
    assert "reset_done" not in state_words({"state": "IDLE", "episode": 2})


def test_a_running_robot_without_fresh_frames_says_why_it_holds() -> None:
    words = state_words({"state": "RUNNING", "episode": 1, "step": 40,
                         "stale_cameras": ["top", "wrist"]})
    assert words == ("RUNNING episode 1 step 40 — no fresh frame from camera top, wrist: "
                     "holding, no act asked"), words
    many = state_words({"state": "RUNNING", "stale_cameras": [f"c{i}" for i in range(6)]})
    assert "c3 (+2 more)" in many and "c4" not in many
    assert "fresh" not in state_words({"state": "RUNNING", "stale_cameras": []})
    assert "\x1b" not in state_words({"state": "RUNNING", "stale_cameras": ["\x1b[2J"]})


def test_torque_during_a_controlled_stop_says_it_is_going_off() -> None:
    stopping = humane.status({"state": "FAULT", "torque": True, "stopping_s": 0.43})
    assert "torque   on — controlled stop (e-stop): off in 0.4 s" in stopping
    assert "torque   off" in humane.status({"state": "FAULT", "torque": False, "stopping_s": 1})
    for bad in (None, "0.4", True, -1.0, float("nan"), float("inf"), 1e300):
        words = humane.status({"state": "FAULT", "torque": True, "stopping_s": bad})
        assert "torque   on\n" in words + "\n", (bad, words)
    assert "torque   —" in humane.status({"state": "IDLE", "torque": "yes"})

"""robotctl's e-stop: through the daemon, else straight to the control lane.

The daemon's main process is asked first (it logs and traces the e-stop); when it does
not confirm (no answer, or an answer of `timeout` or `busy`), the e-stop goes to the
control lane's own socket (lane.sock), which takes it even with the main process gone.
Nothing here claims an e-stop nobody confirmed: the words then say what is known
(humane.estop_unconfirmed). Both `robotctl estop` and the e-stop key of `robotctl watch`
come here.
"""

from __future__ import annotations

from typing import Any

from robotd.operator import humane
from robotd.operator.client import Unreachable, estop_via_lane, request_once
from robotd.operator.locate import Handshake, Target
from robotd.operator.robotctl_args import estop_reason

UNCONFIRMED = frozenset({"timeout", "busy"})  # estop answers that are no confirmation


def estop(target: Target, reason: str, timeout_s: float) -> tuple[str, Any]:
    """The e-stop through the daemon, else straight to the control lane.

    ("ok", result) once confirmed; ("error", (code, message)) when the daemon refused;
    ("unreachable", words) when nobody confirmed it (then it never claims success, and
    the words say what is known: humane.estop_unconfirmed). Any `reason` goes, made
    sendable (estop_reason). A daemon that answers `timeout` or `busy` has not confirmed
    it either: the lane is tried then too."""
    reason = estop_reason(reason)
    if target.control.startswith("tcp://") and target.curve is None:  # locate said why
        said = f"the daemon at {target.control} was not asked (no CURVE keys)"
        return _via_lane(target, reason, timeout_s, said)
    handshake = Handshake(target)  # meanwhile: is the daemon's main process up at all?
    try:
        try:
            reply = request_once(
                target.control,
                "estop",
                {"reason": reason} if reason else {},
                timeout_s=timeout_s,
                curve=target.curve,
            )
        except Unreachable as first:
            up = first.sent and handshake.seen()
            said = humane.daemon_unconfirmed(str(first), first.sent, up, target.control, timeout_s)
            return _via_lane(target, reason, timeout_s, said)
        if reply.get("ok"):
            return "ok", reply.get("result")
        err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
        code, message = str(err.get("code", "error")), str(err.get("message", ""))
        if code not in UNCONFIRMED:
            return "error", (code, message)
        said = f"the daemon is up but its control lane did not confirm: it said {code}: {message}"
        return _via_lane(target, reason, timeout_s, said)
    finally:
        handshake.close()


def _via_lane(target: Target, reason: str, timeout_s: float, daemon: str) -> tuple[str, Any]:
    """The e-stop to lane.sock after the daemon did not confirm it (`daemon`: what is
    known of the daemon, in words)."""
    try:
        return "ok", estop_via_lane(target.lane_control, reason or "robotctl", timeout_s)
    except Unreachable as lane:
        return "unreachable", humane.estop_unconfirmed(daemon, str(lane))


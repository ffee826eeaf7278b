"""robotctl's output for people: replies as short aligned lines, not raw JSON, and
KEY=VALUE arguments read the way the config reads them (TOML values)."""

from __future__ import annotations

from typing import Any

from robotd.operator.words import printable, state_words, torque_words, trace_words

MAX_LINES = 400


def assignments(items: list[str]) -> dict[str, Any]:
    """["gain=2.5", ...] → {"gain": 2.5} (the policy's parameters, TOML values);
    ValueError naming a malformed one."""
    from robotd.config import _parse_value

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"params set: {item!r}: expected KEY=VALUE, a parameter the policy declares "
                "(e.g. gain=2.5; robotctl params lists them)"
            )
        out[key.strip()] = _sendable(key.strip(), _parse_value(value.strip()))
    if not out:
        raise ValueError("params set: give at least one KEY=VALUE")
    return out


def _sendable(key: str, value: Any) -> Any:
    from robotd import wire

    try:
        wire.packb(value)
    except wire.WireError:
        kind = type(value).__name__
        raise ValueError(
            f"params set {key!r}: a {kind} cannot be sent (a string, number, boolean, "
            "array or table can)"
        ) from None
    return value


def _flat(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        rows: list[tuple[str, Any]] = []
        for k, v in value.items():
            rows += _flat(v, f"{prefix}.{printable(k)}" if prefix else printable(k))
        return rows
    return [(prefix, value)]


def _lines(result: Any) -> str:
    rows = _flat(result)
    if not rows or rows == [("", result)]:
        return "" if result is None else printable(result)
    width = min(max(len(k) for k, _ in rows), 40)
    text = [f"{k:<{width}}  {_value(v)}" for k, v in rows[:MAX_LINES]]
    if len(rows) > MAX_LINES:
        text.append(f"… {len(rows) - MAX_LINES} more (--json for all)")
    return "\n".join(text)


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list) and len(v) > 8:
        return printable(f"[{', '.join(map(str, v[:8]))}, … {len(v)} items]")
    return printable(v)


def _set(value: Any) -> bool:
    """A field worth printing: not missing, not empty, not a zero count."""
    return isinstance(value, bool) or value not in (None, "", 0, {}, [])


LINK_FIELDS = (
    ("not_back", "not back: {}"),
    ("policy", "policy {}"),
    ("endpoint", "worker {}"),
    ("reconnects", "{} reconnects"),
    ("worker_gone_s", "worker gone {} s in all"),
)


def link_words(link: dict[str, Any]) -> str:
    """The policy link in a line, only what is set: 'up for 4 s, policy P, worker
    ENDPOINT'; 'gone for 2 s: REASON, …, 3 reconnects, worker gone 7 s in all'."""
    rest = {k: v for k, v in link.items() if _set(v)}
    head = printable(rest.pop("state", "state unknown"))
    since = rest.pop("for_s", None)
    if isinstance(since, int | float) and not isinstance(since, bool):
        head += f" for {since:g} s"
    if "reason" in rest:
        head += f": {printable(rest.pop('reason'))}"
    parts = [head]
    for key, form in LINK_FIELDS:
        if key in rest:
            parts.append(form.format(_value(rest.pop(key))))
    if rest.get("link") == "robotd":  # robotd's own link: the usual one, not worth a word
        rest.pop("link")
    elif "link" in rest:
        parts.append(f"{printable(rest.pop('link'))} link")
    parts += [f"{printable(k)} {_value(v)}" for k, v in rest.items()]
    return ", ".join(parts)


def status(result: dict[str, Any]) -> str:
    lines = [f"state    {state_words(result)}"]
    if isinstance(result.get("queue"), int):
        flight = "  act in flight" if result.get("in_flight") is True else ""
        lines.append(f"queue    {result['queue']} rows{flight}")
    if "torque" in result:
        lines.append(f"torque   {torque_words(result)}")
    if result.get("via") == "lane.sock":
        lines.append("via      lane.sock: the main process did not answer, the control lane did")
    if isinstance(result.get("link"), dict) and result["link"]:
        lines.append(f"link     {link_words(result['link'])}")
    if trace := trace_words(result.get("trace")):
        lines.append(f"trace    {trace}")
    if result.get("run_id"):
        robot = printable(repr(result.get("robot", "?")))
        lines.append(f"run      {printable(result['run_id'])} on robot {robot}")
    return "\n".join(lines)


def result(command: str, value: Any) -> str:
    """One command's result for a person."""
    if isinstance(value, str):
        return printable(value)
    if command in ("status", "start", "stop", "estop", "clear_fault", "reset_done") and isinstance(
        value, dict
    ):
        return status(value)
    if command == "verdict" and isinstance(value, dict):
        said = "success" if value.get("success") else "failure"
        notes = f": {value['notes']}" if value.get("notes") else ""
        return printable(f"episode {value.get('episode')}: {said}{notes}")
    if command == "keygen" and isinstance(value, dict):
        return keygen_words(value)
    return _lines(value)


NOT_STOPPED = "the robot may NOT be stopped"


def daemon_unconfirmed(said: str, sent: bool, up: bool, endpoint: str, timeout_s: float) -> str:
    """What is known of a daemon that did not answer an e-stop: `said`, the client's own
    words, when nothing went out (no socket, a dead one); once it went out, whether the
    daemon's main process is `up` (its socket completed the connection: it took the
    e-stop, its control lane did not confirm it) or not even that. Blames no one it
    cannot know about."""
    if not sent:
        return said
    if up:
        return (
            f"the daemon is up but its control lane did not confirm: {endpoint} took the "
            f"connection and the e-stop, and gave no answer within {timeout_s:g} s"
        )
    who = "stopped, hung or not running"
    if endpoint.startswith("tcp://"):
        who += ", or refusing this client's CURVE keys"
    return (
        f"no answer from the daemon at {endpoint} within {timeout_s:g} s, not even to the "
        f"connection (its main process is {who}: the e-stop cannot have reached it)"
    )


def estop_unconfirmed(daemon: str, lane: str) -> str:
    """An e-stop neither path confirmed, in words: what is known of the daemon (see
    daemon_unconfirmed) and of the control lane, and always that the robot may not be
    stopped."""
    text = f"neither the daemon nor its control lane confirmed the e-stop: {daemon}; {lane}"
    if NOT_STOPPED not in lane:
        text += f": {NOT_STOPPED}; check it, or cut its power"
    return text


def keygen_words(value: dict[str, Any]) -> str:
    """Where each file of a new key pair goes, for its kind (curve.key_kind): a client's
    public key to the daemon's runtime.curve_clients, its secret kept for robotctl; the
    daemon's public key to the operators (robotctl --server-key), its secret to the
    daemon alone (runtime.curve_secret_key)."""
    public, secret = printable(value.get("public")), printable(value.get("secret"))
    if value.get("kind") == "server":
        return (
            f"public key  {public}   (the daemon's: give it to each operator, for robotctl "
            f"--server-key {public} or $ROBOTD_SERVER_KEY)\n"
            f"secret key  {secret}   (stays with the daemon: runtime.curve_secret_key = "
            f'"{secret}", readable by its group only: chgrp robotd {secret} && chmod 0640 '
            f"{secret}; never copy it)"
        )
    use = (
        "robotctl uses it by default"
        if value.get("default")
        else f"give robotctl --key {secret} or $ROBOTCTL_KEY"
    )
    return (
        f"public key  {public}   (copy it into the daemon's runtime.curve_clients "
        f"directory)\nsecret key  {secret}   (keep it here; {use})"
    )

"""An e-stop read out of a message too malformed for its socket's strict decoder.

Both doors that take an e-stop (the operator socket's `estop` request and lane.sock's
`Estop`) carry one out whatever else is wrong with it: a reason that is not UTF-8, an
unknown or deeply nested extra field, an id of the wrong type. Refusing it would leave the
robot moving over a client's bug. What is salvaged is only what an e-stop needs, each field
checked here; the strict decoder's error still goes to the log and the counters. Both
doors are ROUTER sockets and split a message into its reply envelope and bodies alike
(`split_envelope`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

MAX_BODIES = 8  # of one message, searched for an e-stop


@dataclass(frozen=True, slots=True)
class Salvaged:
    """An e-stop's fields as far as they could be read: `rid` None when the id was missing
    or not an integer (or, where the door takes them, a short string); `reason` "" when
    there was none, one naming its type when it was not a string, cut to the door's limit;
    `sent_ns` None unless a positive integer."""

    rid: int | str | None
    reason: str
    sent_ns: int | None


def split_envelope(frames: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """(the reply envelope, the bodies after it: at most MAX_BODIES) of a message as a
    ROUTER socket has it. A DEALER's is [peer id, body, ...]; a REQ's [peer id, b"", body,
    ...]: the empty delimiter stays in the envelope, because a REQ reads a reply only past
    one. Two frames are always [peer id, body], an empty body included."""
    envelope = frames[:2] if len(frames) > 2 and frames[1] == b"" else frames[:1]
    return envelope, frames[len(envelope) :][:MAX_BODIES]


def salvage_estop(
    data: bytes,
    *,
    kind_key: str,
    reason_in_args: bool,
    max_bytes: int,
    max_reason: int,
    max_str_id: int | None,
    label: str,
) -> Salvaged | None:
    """The e-stop in `data` (a msgpack map whose `kind_key` is "estop"), or None when it is
    not one. `reason_in_args`: the reason is at args.reason (the operator request) rather
    than at the top (lane.sock's Estop). `max_str_id`: the longest string id taken (None: the
    door's ids are integers only). `label`: the door's name for its e-stop, said with the
    type of a reason that is not a string ("operator e-stop (its reason was an int)"): the
    fault then says a reason was sent and could not be used, not that none was. Never
    raises."""
    if not isinstance(data, bytes) or len(data) > max_bytes:
        return None
    msg = _loads(data, max_bytes)
    if not isinstance(msg, dict) or msg.get(kind_key) != "estop":
        return None
    holder = msg.get("args") if reason_in_args else msg
    reason = holder.get("reason") if isinstance(holder, dict) else None
    if reason is None:
        reason = ""
    elif not isinstance(reason, str):
        reason = f"{label} (its reason was {_a(type(reason).__name__)})"
    rid = msg.get("id")
    short = max_str_id is not None and type(rid) is str and len(rid) <= max_str_id
    if not (type(rid) is int or short):
        rid = None
    sent = msg.get("sent_ns")
    return Salvaged(rid, reason[:max_reason], sent if type(sent) is int and sent > 0 else None)


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"


def _loads(data: bytes, max_bytes: int) -> Any:
    """`data` decoded as leniently as is still bounded: strings not UTF-8 replaced, any map
    key type, extension types left opaque; containers and strings within `max_bytes`."""
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            unicode_errors="replace",
            strict_map_key=False,
            max_str_len=max_bytes,
            max_bin_len=max_bytes,
            max_ext_len=max_bytes,
            max_array_len=max_bytes,
            max_map_len=max_bytes,
        )
    except Exception:  # any malformation (msgpack raises many kinds): not an e-stop
        return None

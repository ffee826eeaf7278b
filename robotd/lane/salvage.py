"""An e-stop read out of a message too malformed for its socket's strict decoder.

Both doors that take an e-stop (the operator socket's `estop` request and lane.sock's
`Estop`) carry one out whatever else is wrong with it: a reason that is not UTF-8, an
unknown or deeply nested extra field, an id of the wrong type. Refusing it would leave the
robot moving over a client's bug. What is salvaged is only what an e-stop needs, each field
checked here; the strict decoder's error still goes to the log and the counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

MAX_ID_LEN = 64


@dataclass(frozen=True, slots=True)
class Salvaged:
    """An e-stop's fields as far as they could be read: `rid` None when the id was missing
    or not an integer (or, where `str_ids`, a short string); `reason` cut to the socket's
    limit; `sent_ns` None unless a positive integer."""

    rid: int | str | None
    reason: str
    sent_ns: int | None


def salvage_estop(
    data: bytes,
    *,
    kind_key: str,
    reason_in_args: bool,
    max_bytes: int,
    max_reason: int,
    str_ids: bool,
) -> Salvaged | None:
    """The e-stop in `data` (a msgpack map whose `kind_key` is "estop"), or None when it is
    not one. `reason_in_args`: the reason is at args.reason (the operator request) rather
    than at the top (lane.sock's Estop). Never raises."""
    if not isinstance(data, bytes) or len(data) > max_bytes:
        return None
    msg = _loads(data, max_bytes)
    if not isinstance(msg, dict) or msg.get(kind_key) != "estop":
        return None
    holder = msg.get("args") if reason_in_args else msg
    reason = holder.get("reason") if isinstance(holder, dict) else None
    reason = reason[:max_reason] if isinstance(reason, str) else ""
    rid = msg.get("id")
    if not (type(rid) is int or (str_ids and type(rid) is str and len(rid) <= MAX_ID_LEN)):
        rid = None
    sent = msg.get("sent_ns")
    return Salvaged(rid, reason, sent if type(sent) is int and sent > 0 else None)


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

"""Encoding and decoding the lane messages: msgpack through msgspec, validated on the way in.

msgspec was chosen over msgpack + dicts by measurement (bench/tick.py prints both on the
per-tick Step message): it encodes the Step in about a third of the time, and decodes it
validated against the types in less time than msgpack decodes it unchecked.

Decoding never raises anything but `LaneError`, whose message names what was wrong (the
field and the rule, or the size), so a caller can refuse a message with its reason and go
on. Messages above `MAX_MESSAGE_BYTES` are refused before any decoding.
"""

from __future__ import annotations

from typing import Any

import msgspec

from robotd.lane.messages import DownMsg, Estop, UpMsg

MAX_MESSAGE_BYTES = 4 << 20  # a chunk of MAX_ROWS x MAX_JOINTS float64 rows and then some
MAX_ESTOP_BYTES = 4096  # lane.sock's ZMQ_MAXMSGSIZE: a larger message drops its peer, unanswered


class LaneError(ValueError):
    """A lane message that could not be decoded; the message says why."""


_encoder = msgspec.msgpack.Encoder()
_down = msgspec.msgpack.Decoder(DownMsg)
_up = msgspec.msgpack.Decoder(UpMsg)
_up_batch = msgspec.msgpack.Decoder(list[UpMsg])
_estop = msgspec.msgpack.Decoder(Estop)


def encode(msg: msgspec.Struct) -> bytes:
    """One message as msgpack bytes."""
    return _encoder.encode(msg)


def encode_batch(msgs: list[Any]) -> bytes:
    """A tick's messages as one msgpack array (one send instead of one per message)."""
    return _encoder.encode(msgs)


def _decode(decoder: msgspec.msgpack.Decoder, data: Any, what: str) -> Any:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise LaneError(f"{what} message: expected bytes, got {type(data).__name__}")
    size = memoryview(data).nbytes
    if size > MAX_MESSAGE_BYTES:
        raise LaneError(f"{what} message of {size} bytes exceeds the limit of {MAX_MESSAGE_BYTES}")
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise LaneError(f"{what} message: {exc}") from None
    except msgspec.DecodeError as exc:
        raise LaneError(f"{what} message is not msgpack: {exc}") from None


def decode_down(data: Any) -> DownMsg:
    """A message for the control lane; LaneError naming what is wrong."""
    return _decode(_down, data, "lane")


def decode_up(data: Any) -> UpMsg:
    """A message from the control lane; LaneError naming what is wrong."""
    return _decode(_up, data, "control lane")


def decode_up_batch(data: Any) -> list[UpMsg]:
    """A tick's messages from the control lane, in order; LaneError naming what is wrong."""
    return _decode(_up_batch, data, "control lane")


def decode_estop(data: Any) -> Estop:
    """The one message lane.sock takes; LaneError for anything else."""
    return _decode(_estop, data, "e-stop socket")

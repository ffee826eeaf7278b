"""Records to JSON bytes and back, exactly.

Finite floats survive JSON exactly (Python writes the shortest repr that reads back to the
same float64). JSON has no NaN or infinity, and a viewer's JSON parser rejects a message
holding them, so a non-finite value is written as ``null`` and named in ``_nonfinite``
(``{"/rows/3/1": "nan"}``, JSON pointers); `decode` puts it back. numpy arrays and
scalars, dataclasses, enums and msgspec structs are turned into plain JSON on the way.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import math
from typing import Any

import numpy as np

NONFINITE = "_nonfinite"
_NAMES = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class DecodeError(ValueError):
    """A message's bytes are not a record robotd wrote; the text says what is wrong."""


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(obj)).decode("ascii")
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    fields = getattr(type(obj), "__struct_fields__", None)  # a msgspec Struct
    if fields is not None:
        return {name: getattr(obj, name) for name in fields}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    raise TypeError(f"cannot trace a value of type {type(obj).__name__}")


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def _strip_nonfinite(node: Any, path: str, found: dict[str, str]) -> Any:
    if isinstance(node, float) and not math.isfinite(node):
        found[path] = "nan" if math.isnan(node) else ("inf" if node > 0 else "-inf")
        return None
    if isinstance(node, dict):
        return {k: _strip_nonfinite(v, f"{path}/{_escape(k)}", found) for k, v in node.items()}
    if isinstance(node, list):
        return [_strip_nonfinite(v, f"{path}/{i}", found) for i, v in enumerate(node)]
    return node


def strict_json(value: Any) -> str:
    """`value` as strict JSON text (what `json.loads` of any language takes): a non-finite
    float is written null and named in the top-level object's `_nonfinite`, as records are;
    a value JSON has no form for is written as its str()."""
    try:
        return json.dumps(value, default=str, allow_nan=False)
    except ValueError as exc:
        if "Out of range float" not in str(exc):
            raise
    found: dict[str, str] = {}
    plain = _strip_nonfinite(json.loads(json.dumps(value, default=str)), "", found)
    if isinstance(plain, dict):
        plain[NONFINITE] = found
    return json.dumps(plain, allow_nan=False)


def encode(record: Any) -> bytes:
    """A record (a mapping, or a struct/dataclass) as compact JSON bytes. Raises TypeError
    for a value JSON cannot hold and ValueError for a record that is not an object."""
    try:
        text = json.dumps(record, default=_default, allow_nan=False, separators=(",", ":"))
    except ValueError as exc:
        if "Out of range float" not in str(exc):
            raise
        # the slow path, only for a record holding NaN or infinity
        plain = json.loads(json.dumps(record, default=_default))
        found: dict[str, str] = {}
        plain = _strip_nonfinite(plain, "", found)
        if isinstance(plain, dict):
            plain[NONFINITE] = found
        text = json.dumps(plain, allow_nan=False, separators=(",", ":"))
    if not text.startswith("{"):
        raise ValueError(f"a trace record must be an object, got {type(record).__name__}")
    return text.encode()


def _restore(record: dict[str, Any], pointer: str, name: object) -> None:
    if name not in _NAMES or not isinstance(pointer, str) or not pointer.startswith("/"):
        raise DecodeError(f"{NONFINITE}: bad entry {pointer!r}: {name!r}")
    parts = [_unescape(p) for p in pointer[1:].split("/")]
    node: Any = record
    for part in parts[:-1]:
        node = _step(node, part, pointer)
    last = parts[-1]
    if isinstance(node, dict) and node.get(last, 0) is None:
        node[last] = _NAMES[name]  # type: ignore[index]
    elif isinstance(node, list) and last.isdigit() and int(last) < len(node):
        if node[int(last)] is not None:
            raise DecodeError(f"{NONFINITE}: {pointer} is not null")
        node[int(last)] = _NAMES[name]  # type: ignore[index]
    else:
        raise DecodeError(f"{NONFINITE}: {pointer} names no null value")


def _step(node: Any, part: str, pointer: str) -> Any:
    if isinstance(node, dict) and part in node:
        return node[part]
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    raise DecodeError(f"{NONFINITE}: {pointer} names nothing in the record")


def decode(data: bytes) -> dict[str, Any]:
    """The record `encode` wrote, non-finite values restored. DecodeError for anything else."""
    try:
        record = json.loads(data)
    except (ValueError, RecursionError) as exc:  # bad JSON, UTF-8, or a 5000-digit int
        raise DecodeError(f"not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise DecodeError(f"not a JSON object but {type(record).__name__}")
    marks = record.pop(NONFINITE, None)
    if marks is not None:
        if not isinstance(marks, dict) or len(marks) > 1_000_000:
            raise DecodeError(f"{NONFINITE}: not an object")
        for pointer, name in marks.items():
            _restore(record, pointer, name)
    return record


def encode_frame(camera: str, log_time_ns: int, data: bytes, frame_index: int, fmt: str) -> bytes:
    """A frame as Foxglove's CompressedImage in JSON (the image base64, as that schema says)."""
    sec, nsec = divmod(int(log_time_ns), 1_000_000_000)
    head = (
        f'{{"timestamp":{{"sec":{sec},"nsec":{nsec}}},"frame_id":{json.dumps(camera)},'
        f'"format":{json.dumps(fmt)},"frame_index":{int(frame_index)},"data":"'
    )
    return head.encode() + base64.b64encode(data) + b'"}'


def frame_bytes(record: dict[str, Any]) -> bytes:
    """The image bytes of a decoded CompressedImage record (DecodeError when it has none)."""
    data = record.get("data")
    if not isinstance(data, str):
        raise DecodeError("a frame record without image data")
    try:
        return base64.b64decode(data, validate=True)
    except ValueError:
        raise DecodeError("a frame record whose data is not base64") from None

"""robotd's observation window → an openpi request; an openpi reply → action rows.

An openpi server keeps no stream, so each request carries everything the policy reads,
built robot-side from the act's window (what `robotd.link.windows.assemble` makes:
{"observations": [{key: value}, ...], "steps": [...]}, the act's own step last). Pure
functions, no I/O, no state.

- `build_request(options, window, task, rtc)`: one entry per configured input. Cameras (HWC
  uint8 RGB frames as captured) are fitted (resize with pad by default), encoded and laid
  out per the input's `image`; joint sources are sliced and cast; `task` is the episode's
  task text (the input's `default` when there is none). `window = "last"` reads the key's
  newest step in the window, `"stack"` every step that holds it, stacked on a new axis 0.
  RequestError naming the input for an observation that does not fit the mapping.
- `rtc_fields(options, rtc)`: the act's real-time chunking fields (robotd.link.rtc: the
  predicted delay and the frozen prefix, at the server's rate) under the keys
  `[policy.openpi.rtc]` names (`prefix`, `inference_delay`, optionally the rest), as
  (key path, value) pairs; none when the table is unset or the act has none.
  `build_request` puts them in the request when it is given the act's `rtc`.
- `parse_reply(actions, reply, joints)`: the answer's rows (H x D under `actions.key`),
  the configured columns taken in joint order, as float64 (H x joints), with
  `server_timing.infer_ms` when the server sent a usable one. BadReply naming the field
  for anything else; never another exception, whatever the reply holds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from robotd.contract import Camera
from robotd.contract.answers import dtype_problem
from robotd.frames import FrameError, fit_and_encode
from robotd.link.openpi.errors import BadReply, RequestError
from robotd.link.openpi.options import (
    MAX_ROWS,
    TASK,
    ActionsMap,
    ImageSpec,
    Input,
    OpenpiOptions,
    parse_selection,
)


@dataclass(frozen=True, eq=False)
class Answer:
    """One reply, mapped: `rows` (H x joints, float64, writable), `infer_ms` (the server's
    own time for the policy, None when it did not say)."""

    rows: np.ndarray
    infer_ms: float | None


def build_request(
    options: OpenpiOptions,
    window: Mapping[str, Sequence[Any]],
    task: str = "",
    rtc: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The request for one act (see the module doc)."""
    observations = window.get("observations")
    if not isinstance(observations, Sequence) or not observations:
        raise RequestError("the act's window holds no observations")
    request: dict[str, Any] = {}
    for n, inp in enumerate(options.inputs):
        where = f"policy.openpi.inputs[{n}] ({'/'.join(inp.path)} <- {inp.source})"
        if inp.source == TASK:
            value: Any = task or inp.default
        else:
            found = [obs[inp.source] for obs in observations if inp.source in obs]
            if not found:
                raise RequestError(f"{where}: the window holds no {inp.source!r}")
            if inp.window == "last":
                value = _one(inp, found[-1], where)
            else:
                value = _stack([_one(inp, v, where) for v in found])
        _put(request, inp.path, value)
    for path, value in rtc_fields(options, rtc):
        _put(request, path, value)
    return request


def rtc_fields(
    options: OpenpiOptions, rtc: Mapping[str, Any] | None
) -> list[tuple[tuple[str, ...], Any]]:
    """The act's rtc ({"delay", "prefix", "rest"}, robotd.link.rtc) as (key path, value)
    pairs under `[policy.openpi.rtc]`'s keys: the delay an int, the rows float32 arrays
    (p x joints); [] without the table or an rtc. RequestError for malformed fields."""
    if options.rtc is None or rtc is None:
        return []
    delay = rtc.get("delay")
    if isinstance(delay, bool) or not isinstance(delay, int) or delay < 1:
        raise RequestError(f"rtc.delay: not an integer >= 1 ({delay!r:.40})")
    values: dict[str, Any] = {"delay": delay}
    for name in ("prefix", "rest"):
        rows = rtc.get(name)
        if not isinstance(rows, np.ndarray) or rows.ndim != 2:
            raise RequestError(f"rtc.{name}: not a 2-D array of rows")
        values[name] = np.ascontiguousarray(rows, dtype=np.float32)
    return [(path, values[name]) for name, path in options.rtc.paths().items()]


def _one(inp: Input, value: Any, where: str) -> Any:
    if inp.is_camera:
        return _image(inp.image or ImageSpec(), value, inp.source, where)
    return _joints(inp, value, where)


def _stack(values: list[Any]) -> Any:
    if isinstance(values[0], np.ndarray):
        return np.stack(values)
    return values  # encoded images (bytes): a list, oldest first


@functools.lru_cache(maxsize=64)
def _camera(spec: ImageSpec) -> Camera:
    """robotd's camera spec for fit_and_encode (made once per image spec)."""
    return Camera(
        width=spec.width,
        height=spec.height,
        resize=spec.resize,
        filter=spec.filter,
        codec=spec.codec,
        quality=spec.quality,
    )


def _image(spec: ImageSpec, frame: Any, name: str, where: str) -> Any:
    try:
        enc = fit_and_encode(frame, _camera(spec), name=name)
    except FrameError as exc:
        raise RequestError(f"{where}: {exc}") from None
    if enc.codec != "raw":
        return enc.data
    hwc = np.asarray(enc.data)
    return np.ascontiguousarray(hwc.transpose(2, 0, 1)) if spec.layout == "chw" else hwc


def _joints(inp: Input, value: Any, where: str) -> np.ndarray:
    try:
        vec = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise RequestError(f"{where}: {inp.source} is not a vector of numbers") from None
    if vec.ndim != 1:
        raise RequestError(f"{where}: {inp.source} has shape {vec.shape}, expected a vector")
    if inp.joints is not None:
        idx = parse_selection(inp.joints)
        if max(idx) >= vec.shape[0]:
            raise RequestError(
                f"{where}: joint index {max(idx)} is past the {vec.shape[0]} joints observed"
            )
        vec = vec[list(idx)]
    return vec.astype(inp.dtype)


def _put(request: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = request
    for part in path[:-1]:
        node = node.setdefault(part, {})  # options forbid a key inside another key
    node[path[-1]] = value


def parse_reply(actions: ActionsMap, reply: Any, joints: int) -> Answer:
    """The action rows and infer time of one reply (see the module doc)."""
    if not isinstance(reply, Mapping):
        raise BadReply(f"the reply is a {type(reply).__name__}, not a map")
    raw = reply.get(actions.key)
    if raw is None:
        keys = sorted(repr(k)[:40] for k in list(reply)[:20])
        raise BadReply(f"the reply has no {actions.key!r} (its keys: {', '.join(keys)})")
    rows = _rows(raw, actions.key)
    cols = actions.column_indices()
    if cols is not None:
        if max(cols) >= rows.shape[1]:
            raise BadReply(
                f"field {actions.key!r}: {rows.shape[1]} columns, but policy.openpi.actions."
                f"columns names column {max(cols)}"
            )
        rows = rows[:, list(cols)]
    elif rows.shape[1] != joints:
        raise BadReply(
            f"field {actions.key!r}: rows of {rows.shape[1]} columns for the robot's {joints} "
            "joints (set policy.openpi.actions.columns to pick them)"
        )
    return Answer(np.ascontiguousarray(rows), _infer_ms(reply))


def _rows(raw: Any, key: str) -> np.ndarray:
    """The H x D float64 rows of the reply's field, checked: an array of floats (a bool or
    integer one is no joint targets: robotd.contract.answers), or a list of rows of numbers
    (a list has no dtype: its integers are read as floats, its bools refused)."""
    if isinstance(raw, np.ndarray):
        problem = dtype_problem(raw.dtype)
        if problem is not None:
            raise BadReply(f"field {key!r}: {problem}")
        arr = raw
    elif isinstance(raw, list):
        arr = _rows_from_list(raw, key)
    else:
        raise BadReply(f"field {key!r}: a {type(raw).__name__}, not an H x D array")
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise BadReply(f"field {key!r}: shape {arr.shape}, expected H x D rows (H, D >= 1)")
    if arr.shape[0] > MAX_ROWS:
        raise BadReply(f"field {key!r}: {arr.shape[0]} rows (at most {MAX_ROWS})")
    rows = arr.astype(np.float64)  # a fresh array: never a view of the reply
    if not np.isfinite(rows).all():
        raise BadReply(f"field {key!r}: holds NaN or infinity")
    return rows


def _rows_from_list(raw: list[Any], key: str) -> np.ndarray:
    if len(raw) > MAX_ROWS:
        raise BadReply(f"field {key!r}: {len(raw)} rows (at most {MAX_ROWS})")
    ok = all(
        isinstance(row, list)
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in row)
        for row in raw
    )
    widths = {len(row) for row in raw} if ok else set()
    if not ok or len(widths) != 1:
        raise BadReply(f"field {key!r}: not a list of equal-length rows of numbers")
    try:
        return np.array(raw, dtype=np.float64)
    except OverflowError:
        raise BadReply(f"field {key!r}: a number out of float64 range") from None


def _infer_ms(reply: Mapping[Any, Any]) -> float | None:
    timing = reply.get("server_timing")
    if not isinstance(timing, Mapping):
        return None
    value = timing.get("infer_ms")
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None

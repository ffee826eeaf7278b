"""The rules every answer is held to, on whichever side checks it (docs/contract.md,
"bounds on an answer"): the worker before an answer leaves it (robotd.worker.policy_host),
the daemon on what a worker sends (robotd.link.replies), the openpi link on a server's reply
(robotd.link.openpi.request). One wording, so that a refusal reads the same wherever it
happened.

- Rows are joint targets, so they are floating point. A bool array is a mask, an integer
  one token ids or servo ticks: neither is played as radians. (Lists of rows carry no dtype:
  their numbers are read as floats; see `dtype_problem`'s callers.)
- No robot takes more than MAX_ANSWER_ROWS rows (the ceiling of policy.max_chunk_rows, and
  the control lane's own bound) or more than MAX_ANSWER_COLUMNS columns (the most joints the
  control lane carries). The worker does not know the robot it serves, so it refuses only
  answers over these, which no robot could play: a policy's runaway answer never crosses a
  socket, and the daemon is told its shape (`oversized`), not sent its bytes.
"""

from __future__ import annotations

import re

import numpy as np

MAX_ANSWER_ROWS = 4096  # = policy.max_chunk_rows' upper bound = robotd.lane.messages.MAX_ROWS
MAX_ANSWER_COLUMNS = 64  # = robotd.lane.messages.MAX_JOINTS
MAX_ANSWER_BYTES = MAX_ANSWER_ROWS * MAX_ANSWER_COLUMNS * 8  # 2 MiB: float64 is the widest

# The worker's refusal of an oversized answer, as `oversized` parses it back (the daemon
# then names its own, tighter bound for the same shape).
_OVERSIZED = "shape ({rows}, {columns}) is over what any robot plays"
_OVERSIZED_RX = re.compile(r"shape \((\d{1,19}), (\d{1,19})\) is over what any robot plays")


def dtype_problem(dtype: np.dtype) -> str | None:
    """Why rows of `dtype` are no joint targets ("dtype bool: ..."), or None for floats."""
    if dtype.kind == "f":
        return None
    if dtype.kind == "b":
        return f"dtype {dtype}: a mask is never a joint target; return floats (joint units, rad)"
    if dtype.kind in "iu":
        return (
            f"dtype {dtype}: integers are no joint targets (token ids? servo ticks?); "
            "return floats (joint units, rad), e.g. rows.astype(np.float32)"
        )
    return f"dtype {dtype} is not numeric; return floats (joint units, rad)"


def size_problem(shape: tuple[int, ...], itemsize: int) -> str | None:
    """Why 2-D rows of `shape` (items of `itemsize` bytes) are more than any robot plays,
    naming the shape, its size and the bound; None when within it."""
    rows, columns = shape
    if rows <= MAX_ANSWER_ROWS and columns <= MAX_ANSWER_COLUMNS:
        return None
    size = _size(rows * columns * itemsize)
    return (
        _OVERSIZED.format(rows=rows, columns=columns)
        + f" ({size}; at most {MAX_ANSWER_ROWS} rows of at most {MAX_ANSWER_COLUMNS} joints, "
        f"{_size(MAX_ANSWER_BYTES)}): refused before it was sent"
    )


def oversized(message: str) -> tuple[int, int] | None:
    """The (rows, columns) a worker's `size_problem` message names, or None."""
    found = _OVERSIZED_RX.search(message)
    return None if found is None else (int(found[1]), int(found[2]))


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"

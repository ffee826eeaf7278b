"""A policy for the framed-link tests (tests/test_link_framed.py), importable by a copy
process (this directory is on its PYTHONPATH)."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np


class Digest:
    """No observation contract: handed the act's own observation.

    Asked `{"answer": [dtype, rows, cols]}`: answers rows of that dtype, value (i * cols + j)
    % 101 at row i column j. Handed `keep`: keeps that array (as a policy keeping a frame
    history would). Otherwise: one float64 row per array it was handed (and the kept one,
    last), sorted by key: [crc32 of its bytes, nbytes, ndim, dtype number, writeable]."""

    def __init__(self) -> None:
        self.kept: np.ndarray | None = None

    def infer(self, obs: dict[str, Any]) -> np.ndarray:
        if "keep" in obs:
            self.kept = obs["keep"]
        answer = obs.get("answer")
        if answer is not None:
            dtype, rows, cols = answer
            return (np.arange(rows * cols) % 101).reshape(rows, cols).astype(dtype)
        arrays = [obs[k] for k in sorted(obs) if isinstance(obs[k], np.ndarray)]
        if self.kept is not None:
            arrays.append(self.kept)
        return np.array(
            [
                [zlib.crc32(a.tobytes()), a.nbytes, a.ndim, a.dtype.num, a.flags.writeable]
                for a in arrays
            ]
            or [[0.0] * 5],
            dtype=np.float64,
        )

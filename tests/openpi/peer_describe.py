"""A JSON description of a decoded message, the same under numpy 1 (the peer venv) and
numpy 2 (robotd's): what the tests compare across the two sides."""

from __future__ import annotations

import hashlib

import numpy as np


def describe(value):
    """Type, dtype (numpy's dtype.str), shape and a checksum of the bytes, recursively."""
    if isinstance(value, np.ndarray):
        digest = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()[:16]
        return {
            "type": "ndarray",
            "dtype": value.dtype.str,
            "shape": list(value.shape),
            "sha": digest,
            "writeable": bool(value.flags.writeable),
        }
    if isinstance(value, np.generic):
        return {"type": "npgeneric", "dtype": value.dtype.str, "value": repr(value.item())}
    if isinstance(value, dict):
        return {"type": "dict", "items": [[_key(k), describe(v)] for k, v in value.items()]}
    if isinstance(value, list | tuple):
        return {"type": "list", "items": [describe(v) for v in value]}
    if isinstance(value, bytes):
        return {"type": "bytes", "sha": hashlib.sha256(value).hexdigest()[:16]}
    return {"type": type(value).__name__, "value": repr(value)}


def _key(k):
    return ["bytes", k.hex()] if isinstance(k, bytes) else ["str", k]

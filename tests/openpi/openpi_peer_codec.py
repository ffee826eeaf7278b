"""openpi-client's msgpack_numpy on the other side of robotd's codec. Runs in the peer venv.

    python openpi_peer_codec.py IN OUT

IN: one message robotd encoded (a list of samples). It is decoded with openpi's
`msgpack_numpy.unpackb`, described on stdout as one JSON line (peer_describe), and
packed again with openpi's `msgpack_numpy.packb` into OUT, followed by openpi's own
samples (`samples()`): OUT holds [decoded_again, openpi_samples].
"""

from __future__ import annotations

import json
import sys

import numpy as np
from openpi_client import msgpack_numpy
from peer_describe import describe


def samples():
    rng = np.random.default_rng(7)
    out = [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        rng.integers(0, 256, size=(224, 224, 3), dtype=np.uint8),
        np.array([True, False, True]),
        np.zeros((0, 3), dtype=np.int16),
        np.arange(6, dtype=">f8").reshape(2, 3),
        np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
        np.float16(1.5),
        np.int64(-(2**62)),
        np.uint8(255),
        np.bool_(True),
        {
            "actions": rng.standard_normal((10, 8)).astype(np.float32),
            "server_timing": {"infer_ms": 1.5},
        },
        {"nested": {"deeper": [np.ones(2, dtype=np.uint16), "text", b"bin", None, 3, 2.5]}},
    ]
    dtypes = ("<i1", "<i2", "<i4", "<i8", "<u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8", "|b1")
    for dtype in dtypes:
        out.append(rng.integers(0, 2, size=(2, 3)).astype(dtype))
    return out


def main():
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    decoded = msgpack_numpy.unpackb(data)
    print(json.dumps(describe(decoded)))
    with open(sys.argv[2], "wb") as f:
        f.write(msgpack_numpy.packb([decoded, samples()]))
    print(json.dumps(describe(samples())))


if __name__ == "__main__":
    main()

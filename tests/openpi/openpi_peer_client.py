"""openpi-client's own WebsocketClientPolicy, timed: the baseline of bench/openpi.py.
Runs in the peer venv.

    python openpi_peer_client.py URL --calls N --warmup W

Sends a DROID-like observation (two 224x224x3 uint8 images, 7 + 1 float32 joints, a
prompt) N times after W warm-up calls; prints one JSON line: {"rtt_ms": [...]}.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy


def observation():
    rng = np.random.default_rng(0)
    return {
        "observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/joint_position": np.zeros(7, dtype=np.float32),
        "observation/gripper_position": np.zeros(1, dtype=np.float32),
        "prompt": "pick up the cup",
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()
    policy = WebsocketClientPolicy(host=args.url)
    obs = observation()
    for _ in range(args.warmup):
        policy.infer(obs)
    out = []
    for _ in range(args.calls):
        t = time.perf_counter()
        policy.infer(obs)
        out.append((time.perf_counter() - t) * 1e3)
    print(json.dumps({"rtt_ms": out}))


if __name__ == "__main__":
    main()

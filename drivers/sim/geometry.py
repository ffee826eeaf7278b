"""The simulated world's fixed geometry, shared by the sim arm, the sim cameras
and the demo policy (which must find the dot in pixels and reach it by IK).

World units are metres-ish; the arm's base sits at the origin, +y is up in the
top camera's image. The target dot runs a Lissajous path kept inside reach.
"""

from __future__ import annotations

import math

import numpy as np

# Two-link planar arm.
LINK1 = 1.0
LINK2 = 0.8

# Target dot: x = CX + AX sin(2π FX t), y = CY + AY sin(2π FY t + PHASE).
CX, CY = 0.9, 0.5
AX, AY = 0.5, 0.4
FX, FY = 0.10, 0.15
PHASE = math.pi / 2
DOT_RADIUS = 0.04

# The top camera sees this world box (4:3, like 640×480).
TOP_VIEW = (-0.4, -0.5, 2.0, 1.3)  # x0, y0, x1, y1
# The wrist camera sees a box this wide centred on the tip (same aspect as its image).
WRIST_SPAN = 0.6

# Colours (RGB) the renderer uses and the demo policy looks for.
BACKGROUND = (40, 40, 40)
ARM_COLOUR = (60, 110, 230)
TIP_COLOUR = (60, 220, 90)
DOT_COLOUR = (235, 40, 40)


def target_at(t_s: float) -> np.ndarray:
    """The dot's world position at sim time t_s (seconds since the world's start)."""
    return np.array(
        [
            CX + AX * math.sin(2 * math.pi * FX * t_s),
            CY + AY * math.sin(2 * math.pi * FY * t_s + PHASE),
        ]
    )


def forward(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Elbow and tip positions of the arm at joint angles q[0] (shoulder), q[1] (elbow)."""
    a, b = float(q[0]), float(q[1])
    elbow = np.array([LINK1 * math.cos(a), LINK1 * math.sin(a)])
    tip = elbow + np.array([LINK2 * math.cos(a + b), LINK2 * math.sin(a + b)])
    return elbow, tip


def inverse(p: np.ndarray, elbow_up: bool = False) -> np.ndarray:
    """Joint angles (shoulder, elbow) putting the tip at p; unreachable p is pulled into reach."""
    x, y = float(p[0]), float(p[1])
    r = math.hypot(x, y)
    lo, hi = abs(LINK1 - LINK2) + 1e-6, LINK1 + LINK2 - 1e-6
    if r < lo or r > hi:
        scale = min(max(r, lo), hi) / max(r, 1e-9)
        x, y, r = x * scale, y * scale, min(max(r, lo), hi)
    c2 = (r * r - LINK1 * LINK1 - LINK2 * LINK2) / (2 * LINK1 * LINK2)
    c2 = min(1.0, max(-1.0, c2))
    b = math.acos(c2) * (1.0 if elbow_up else -1.0)
    a = math.atan2(y, x) - math.atan2(LINK2 * math.sin(b), LINK1 + LINK2 * math.cos(b))
    return np.array([a, b])


def world_to_pixel(p: np.ndarray, view: tuple[float, float, float, float], w: int, h: int):
    """Pixel (u, v) of world point p in an image of w×h showing `view`."""
    x0, y0, x1, y1 = view
    u = (p[0] - x0) / (x1 - x0) * w
    v = (y1 - p[1]) / (y1 - y0) * h
    return u, v


def pixel_to_world(u: float, v: float, view: tuple[float, float, float, float], w: int, h: int):
    """Inverse of world_to_pixel."""
    x0, y0, x1, y1 = view
    return np.array([x0 + u / w * (x1 - x0), y1 - v / h * (y1 - y0)])

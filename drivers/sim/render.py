"""Pictures of the simulated world, as the top and wrist cameras see it.

Pure functions of (view, size, joint positions, sim time). Drawing is aliased
(cv2.LINE_8) so that every pixel is exactly one of geometry's colours: the demo
policy finds the dot by colour.

Pixel convention: pixel (i, j) covers u in [i, i + 1), v in [j, j + 1) of
geometry.world_to_pixel, so the centroid of a disc's pixels plus 0.5 is the
disc's world_to_pixel position.
"""

from __future__ import annotations

import functools
import math

import cv2
import numpy as np

from drivers.sim import geometry as g

VIEWS = ("top", "wrist")
LINK_WIDTH = 0.04  # world units
TIP_RADIUS = 0.035  # world units
_SHIFT = 4  # fractional bits of cv2 coordinates
_ONE = 1 << _SHIFT


Box = tuple[float, float, float, float]


def view_box(view: str, width: int, height: int, q: np.ndarray) -> Box:
    """The world box (x0, y0, x1, y1) that camera `view` shows in a width x height image."""
    if view == "top":
        return g.TOP_VIEW
    if view == "wrist":
        _, tip = g.forward(q)
        half_w = g.WRIST_SPAN / 2
        half_h = half_w * height / width
        return (tip[0] - half_w, tip[1] - half_h, tip[0] + half_w, tip[1] + half_h)
    raise ValueError(f"render: view must be one of {VIEWS}, got {view!r}")


def render(
    view: str,
    width: int,
    height: int,
    q: np.ndarray,
    t_s: float,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """An RGB uint8 image (height, width, 3) of the world at sim time t_s with the arm at q.

    Background, the arm's two links, its tip, then the target dot on top. `out`
    (uint8, (height, width, 3), C-contiguous) is drawn into and returned if given.
    """
    if not (isinstance(width, int) and isinstance(height, int) and width > 0 and height > 0):
        raise ValueError(f"render: width and height must be ints > 0, got {width!r}, {height!r}")
    q = np.asarray(q, dtype=np.float64)
    if q.ndim != 1 or q.shape[0] < 2 or not np.all(np.isfinite(q[:2])):
        raise ValueError(f"render: q needs 2 finite arm joint positions, got {q!r}")
    if not math.isfinite(t_s):
        raise ValueError(f"render: t_s must be finite, got {t_s!r}")
    box = view_box(view, width, height, q)
    if out is None:
        out = np.empty((height, width, 3), np.uint8)
    elif out.shape != (height, width, 3) or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(
            f"render: out must be C-contiguous uint8 ({height}, {width}, 3), "
            f"got {out.dtype} {out.shape}"
        )
    sx = width / (box[2] - box[0])
    sy = height / (box[3] - box[1])

    def px(p: np.ndarray) -> tuple[int, int]:
        u, v = g.world_to_pixel(p, box, width, height)
        return round((u - 0.5) * _ONE), round((v - 0.5) * _ONE)

    np.copyto(out, _background_row(width))  # broadcast; assigning the tuple is ~100x slower
    elbow, tip = g.forward(q)
    thickness = max(1, round(LINK_WIDTH * sx))
    base = px(np.zeros(2))
    cv2.line(out, base, px(elbow), g.ARM_COLOUR, thickness, cv2.LINE_8, _SHIFT)
    cv2.line(out, px(elbow), px(tip), g.ARM_COLOUR, thickness, cv2.LINE_8, _SHIFT)
    _disc(out, px(tip), TIP_RADIUS * sx, TIP_RADIUS * sy, g.TIP_COLOUR)
    dot = g.target_at(t_s)
    _disc(out, px(dot), g.DOT_RADIUS * sx, g.DOT_RADIUS * sy, g.DOT_COLOUR)
    return out


@functools.lru_cache(maxsize=8)
def _background_row(width: int) -> np.ndarray:
    row = np.empty((width, 3), np.uint8)
    row[:] = g.BACKGROUND
    row.flags.writeable = False
    return row


def _disc(
    img: np.ndarray, centre: tuple[int, int], rx: float, ry: float, colour: tuple[int, int, int]
) -> None:
    axes = (max(1, round(rx * _ONE)), max(1, round(ry * _ONE)))
    cv2.ellipse(img, centre, axes, 0, 0, 360, colour, -1, cv2.LINE_8, _SHIFT)

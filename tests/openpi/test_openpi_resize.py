"""robotd's letterboxing (robotd.frames, resize = "pad", the default `area` filter) against
openpi-client's own `image_tools.resize_with_pad` (PIL, run in the peer venv): a policy
trained on frames that went through openpi's preprocessing must see its content in the same
pixels (same size, same offsets) with the same values up to the two libraries' filters."""

from __future__ import annotations

import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest
from peer_venv import HERE

from robotd.contract import Camera
from robotd.frames import fit
from robotd.link.openpi.options import OpenpiOptions
from robotd.link.openpi.request import build_request

# (source height, width) -> (target height, width): the cameras users have, the sizes
# openpi's examples ask for, and ones whose scaled size is not a whole number.
CASES = [
    ((480, 640), (224, 224)),
    ((720, 1280), (224, 224)),
    ((480, 640), (224, 320)),
    ((240, 320), (224, 224)),
    ((1080, 1920), (180, 320)),
    ((481, 643), (224, 224)),
]


def _scene(h: int, w: int, seed: int) -> np.ndarray:
    """A camera-like image: smooth shading, edges and texture (blurred noise)."""
    rng = np.random.default_rng(seed)
    img = cv2.GaussianBlur(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), (0, 0), 2.5)
    cv2.rectangle(img, (w // 5, h // 4), (w // 2, h // 2), (230, 40, 30), -1)
    cv2.circle(img, (2 * w // 3, 2 * h // 3), min(h, w) // 8, (20, 200, 60), -1)
    return img


@pytest.mark.parametrize(("src", "dst"), CASES)
def test_letterboxing_matches_openpi_clients_resize_with_pad(
    peer: Path, tmp_path: Path, src: tuple[int, int], dst: tuple[int, int]
) -> None:
    images = {f"i{i}": _scene(*src, seed=i) for i in range(3)}
    np.savez(tmp_path / "in.npz", **images)
    cmd = [str(peer), str(HERE / "openpi_peer_resize.py"), str(tmp_path / "in.npz"),
           str(tmp_path / "out.npz"), str(dst[0]), str(dst[1])]  # fmt: skip
    subprocess.run(cmd, check=True, timeout=120)
    theirs = np.load(tmp_path / "out.npz")
    spec = {"width": dst[1], "height": dst[0]}  # the openpi link's defaults: pad, area
    opts = OpenpiOptions.model_validate({"inputs": [{"key": "i", "source": "c", "image": spec}]})
    cam = Camera(width=dst[1], height=dst[0], resize="pad")  # robotd's own camera spec
    for key, img in images.items():
        sent = build_request(opts, {"observations": [{"c": img}], "steps": [0]})["i"]
        ours, ref = fit(img, cam).astype(int), theirs[key].astype(int)
        assert np.array_equal(sent, ours)  # the openpi link letterboxes as robotd does
        assert ours.shape == ref.shape == (*dst, 3)
        # the same pixels hold the picture: the letterbox bars are exactly where openpi's are
        assert _content_box(ours) == _content_box(ref)
        # the values agree up to the filters (cv2's area box against PIL's antialiased
        # bilinear triangle): about a grey level on average, a few at edges
        diff = np.abs(ours - ref)
        assert diff.mean() < 1.5 and np.percentile(diff, 99) <= 8, (diff.mean(), diff.max())


def _content_box(img: np.ndarray) -> tuple[int, int, int, int]:
    rows, cols = np.where(img.any(axis=(1, 2)))[0], np.where(img.any(axis=(0, 2)))[0]
    return int(rows.min()), int(rows.max()), int(cols.min()), int(cols.max())

"""Camera frame fitting and codecs (robotd.frames): shapes, placement, round trips, errors."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from robotd import wire
from robotd.contract import Camera
from robotd.frames import (
    Encoded,
    FrameError,
    decode,
    encode,
    fit,
    fit_and_encode,
    to_wire,
)

RED = (255, 0, 0)


def solid(h: int, w: int, rgb: tuple[int, int, int] = (0, 0, 0)) -> np.ndarray:
    out = np.empty((h, w, 3), dtype=np.uint8)
    out[:] = rgb
    return out


def smooth(h: int, w: int) -> np.ndarray:
    """A gradient image: JPEG-friendly, every channel distinct."""
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) % 256], -1)
    return img.astype(np.uint8)


def noise(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def centroid(mask: np.ndarray) -> tuple[float, float]:
    ys, xs = np.nonzero(mask)
    return float(ys.mean()), float(xs.mean())


def roundtrip(frame: np.ndarray, cam: Camera | None, layout: str = "hwc_uint8") -> np.ndarray:
    """Through the real wire (msgpack), as the worker receives it."""
    msg = wire.unpackb(wire.packb(to_wire(fit_and_encode(frame, cam, name="cam"))))
    return decode(msg, layout, name="cam")


# ---------------------------------------------------------------- fit


def test_no_spec_or_no_size_leaves_the_frame_unchanged() -> None:
    frame = noise(30, 40)
    assert fit(frame, None) is frame
    assert fit(frame, Camera(codec="jpeg")) is frame


def test_non_contiguous_input_comes_out_contiguous() -> None:
    frame = noise(30, 80)[:, ::2]
    out = fit(frame, None)
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, frame)


@pytest.mark.parametrize("mode", ["stretch", "crop", "pad"])
@pytest.mark.parametrize("size", [(64, 48), (32, 32), (200, 50), (7, 300)])
def test_every_mode_gives_the_declared_shape(mode: str, size: tuple[int, int]) -> None:
    w, h = size
    out = fit(noise(60, 80), Camera(width=w, height=h, resize=mode))
    assert out.shape == (h, w, 3)
    assert out.dtype == np.uint8
    assert out.flags.c_contiguous


@pytest.mark.parametrize("filt", ["area", "linear", "cubic"])
def test_every_filter_is_accepted_up_and_down(filt: str) -> None:
    frame = smooth(40, 60)
    down = fit(frame, Camera(width=30, height=20, filter=filt))
    up = fit(frame, Camera(width=120, height=80, filter=filt))
    assert down.shape == (20, 30, 3) and up.shape == (80, 120, 3)
    # A smooth gradient stays close to itself when resampled either way.
    assert np.abs(up[::2, ::2].astype(int) - frame.astype(int)).mean() < 4
    assert np.abs(down.astype(int) - frame[::2, ::2].astype(int)).mean() < 4


def test_the_filter_reaches_the_resampler() -> None:
    frame = noise(40, 60)
    outs = {
        f: fit(frame, Camera(width=45, height=30, filter=f)) for f in ("area", "linear", "cubic")
    }
    assert not np.array_equal(outs["area"], outs["linear"])
    assert not np.array_equal(outs["linear"], outs["cubic"])


def test_same_size_is_not_resampled() -> None:
    frame = noise(20, 30)
    for mode in ("stretch", "crop", "pad"):
        np.testing.assert_array_equal(fit(frame, Camera(width=30, height=20, resize=mode)), frame)


def test_stretch_fills_the_whole_target() -> None:
    out = fit(solid(30, 90, RED), Camera(width=40, height=40, resize="stretch"))
    assert (out == RED).all()


def test_pad_letterboxes_a_wide_frame_with_zero_bars_top_and_bottom() -> None:
    # 100x50 (WxH) into 80x80: scaled to 80x40, bars of 20 rows above and below.
    out = fit(solid(50, 100, (200, 100, 50)), Camera(width=80, height=80, resize="pad"))
    assert (out[:20] == 0).all() and (out[60:] == 0).all()
    assert (out[20:60] == (200, 100, 50)).all()


def test_pad_letterboxes_a_tall_frame_with_zero_bars_left_and_right() -> None:
    out = fit(solid(100, 50, RED), Camera(width=80, height=80, resize="pad"))
    assert (out[:, :20] == 0).all() and (out[:, 60:] == 0).all()
    assert (out[:, 20:60] == RED).all()


def test_pad_keeps_a_centred_marker_centred() -> None:
    frame = solid(60, 120)
    frame[26:34, 56:64] = 255  # centre of the 60x120 frame is (29.5, 59.5)
    out = fit(frame, Camera(width=100, height=100, resize="pad", filter="linear"))
    cy, cx = centroid(out[..., 0] > 127)
    assert abs(cy - 49.5) < 1 and abs(cx - 49.5) < 1


def test_crop_keeps_the_centre_and_drops_the_sides() -> None:
    # 120x60 into 60x60: cover scale is 1, so the middle 60 columns stay exactly.
    frame = solid(60, 120, RED)
    frame[:, 30:90] = (0, 0, 255)
    out = fit(frame, Camera(width=60, height=60, resize="crop"))
    assert (out == (0, 0, 255)).all()


def test_crop_keeps_a_centred_marker_centred_when_scaling() -> None:
    frame = solid(90, 160)
    frame[40:50, 75:85] = 255
    out = fit(frame, Camera(width=64, height=64, resize="crop", filter="linear"))
    cy, cx = centroid(out[..., 0] > 127)
    assert abs(cy - 31.5) < 1 and abs(cx - 31.5) < 1
    # Cropped, not squeezed: the square marker stays (about) square.
    ys, xs = np.nonzero(out[..., 0] > 127)
    assert abs(np.ptp(ys) - np.ptp(xs)) <= 1


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((10, 10), np.uint8),
        np.zeros((10, 10, 4), np.uint8),
        np.zeros((10, 10, 1), np.uint8),
        np.zeros((10, 10, 3), np.float32),
        np.zeros((0, 10, 3), np.uint8),
        [[1, 2, 3]],
    ],
)
def test_bad_frames_in_raise_frame_error_naming_camera_and_shape(bad: Any) -> None:
    for call in (fit, encode):
        with pytest.raises(FrameError) as info:
            call(bad, Camera(width=8, height=8), name="wrist")
        msg = str(info.value)
        assert "camera 'wrist'" in msg and "HWC uint8" in msg
        assert info.value.camera == "wrist"
        if isinstance(bad, np.ndarray):
            assert str(bad.shape) in msg and str(bad.dtype) in msg


# ---------------------------------------------------------------- codecs


def test_raw_is_the_default_and_exact_through_the_wire() -> None:
    frame = noise(24, 32)
    enc = encode(frame, None)
    assert enc.codec == "raw" and enc.shape == (24, 32, 3) and enc.nbytes() == frame.nbytes
    np.testing.assert_array_equal(roundtrip(frame, None), frame)
    np.testing.assert_array_equal(roundtrip(frame, Camera(codec="raw")), frame)


def test_png_is_exact_through_the_wire() -> None:
    frame = noise(24, 32, seed=1)
    enc = encode(frame, Camera(codec="png"))
    assert enc.codec == "png" and isinstance(enc.data, bytes)
    assert enc.data.startswith(b"\x89PNG")
    np.testing.assert_array_equal(roundtrip(frame, Camera(codec="png")), frame)


def test_jpeg_round_trip_is_close_at_quality_90_and_smaller_at_low_quality() -> None:
    frame = smooth(96, 128)
    out = roundtrip(frame, Camera(codec="jpeg", quality=90))
    assert out.shape == frame.shape and out.dtype == np.uint8
    assert np.abs(out.astype(int) - frame.astype(int)).mean() < 3
    small = encode(noise(96, 128), Camera(codec="jpeg", quality=10))
    big = encode(noise(96, 128), Camera(codec="jpeg", quality=95))
    assert small.nbytes() < big.nbytes()


@pytest.mark.parametrize("codec", ["jpeg", "png", "raw"])
@pytest.mark.parametrize("rgb", [RED, (0, 0, 255), (0, 255, 0)])
def test_colour_order_is_preserved(codec: str, rgb: tuple[int, int, int]) -> None:
    out = roundtrip(solid(32, 32, rgb), Camera(codec=codec, quality=90))
    mean = out.reshape(-1, 3).mean(0)
    np.testing.assert_allclose(mean, rgb, atol=4)


def test_fit_and_encode_fits_then_encodes() -> None:
    cam = Camera(width=40, height=30, resize="pad", codec="png")
    enc = fit_and_encode(noise(50, 50), cam)
    assert enc.codec == "png" and enc.shape == (30, 40, 3)
    assert decode(to_wire(enc)).shape == (30, 40, 3)


def test_to_wire_is_msgpack_able_for_every_codec() -> None:
    for codec in ("jpeg", "png", "raw"):
        msg = to_wire(encode(noise(8, 8), Camera(codec=codec)))
        assert set(msg) == {"codec", "shape", "data"} and msg["shape"] == [8, 8, 3]
        assert wire.unpackb(wire.packb(msg))["codec"] == codec


def test_encoded_is_frozen() -> None:
    enc = encode(noise(4, 4), None)
    assert isinstance(enc, Encoded)
    with pytest.raises(AttributeError):
        enc.codec = "png"  # type: ignore[misc]


@pytest.mark.parametrize("codec", ["jpeg", "png", "raw"])
def test_chw_float_layout_and_range(codec: str) -> None:
    frame = smooth(20, 30)
    frame[0, 0] = (0, 0, 0)
    frame[-1, -1] = (255, 255, 255)
    out = roundtrip(frame, Camera(codec=codec, quality=100), layout="chw_float")
    assert out.shape == (3, 20, 30) and out.dtype == np.float32 and out.flags.c_contiguous
    assert out.min() >= 0.0 and out.max() <= 1.0
    hwc = roundtrip(frame, Camera(codec=codec, quality=100))
    np.testing.assert_allclose(out, hwc.transpose(2, 0, 1) / 255.0, atol=1e-6)
    if codec != "jpeg":
        assert out.max() == 1.0 and out.min() == 0.0


def test_encoding_runs_in_threads() -> None:
    frames = [noise(64, 64, seed=i) for i in range(4)]
    cam = Camera(codec="png")
    out: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        out[i] = decode(to_wire(encode(frames[i], cam)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    for i, frame in enumerate(frames):
        np.testing.assert_array_equal(out[i], frame)


# ---------------------------------------------------------------- untrusted messages


def good(codec: str = "jpeg") -> dict[str, Any]:
    return to_wire(encode(smooth(16, 24), Camera(codec=codec)))


def with_(msg: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**msg, **changes}


def bad_messages() -> list[tuple[str, Any, str]]:
    """(label, message, text the error must contain)."""
    jpeg, png, raw = good("jpeg"), good("png"), good("raw")
    return [
        ("not a mapping", [1, 2], "must be a mapping"),
        ("missing data", {"codec": "jpeg", "shape": [16, 24, 3]}, "missing data"),
        ("extra key", with_(jpeg, extra=1), "unknown 'extra'"),
        ("unknown codec", with_(jpeg, codec="webp"), "unknown codec 'webp'"),
        ("codec not str", with_(jpeg, codec=7), "unknown codec 7"),
        ("shape of 2", with_(jpeg, shape=[16, 24]), "3 integers"),
        ("shape not list", with_(jpeg, shape="16x24"), "3 integers"),
        ("shape floats", with_(jpeg, shape=[16.0, 24, 3]), "3 integers"),
        ("shape bools", with_(jpeg, shape=[True, 24, 3]), "3 integers"),
        ("4 channels", with_(jpeg, shape=[16, 24, 4]), "4 channels"),
        ("zero height", with_(jpeg, shape=[0, 24, 3]), "height 0 out of range"),
        ("huge width", with_(jpeg, shape=[16, 10**9, 3]), "width 1000000000 out of range"),
        ("huge area", with_(jpeg, shape=[16384, 16384, 3]), "268435456 pixels, over 33554432"),
        ("jpeg wrong shape", with_(jpeg, shape=[24, 16, 3]), "header says 16x24"),
        ("png wrong shape", with_(png, shape=[16, 25, 3]), "header says 16x24"),
        (
            "truncated jpeg",
            with_(jpeg, data=jpeg["data"][: len(jpeg["data"]) // 2]),
            "corrupt or truncated jpeg",
        ),
        ("jpeg header only", with_(jpeg, data=jpeg["data"][:10]), "corrupt jpeg"),
        ("garbage jpeg", with_(jpeg, data=b"\x00" * 100), "corrupt jpeg"),
        ("empty jpeg", with_(jpeg, data=b""), "corrupt jpeg"),
        (
            "truncated png",
            with_(png, data=png["data"][: len(png["data"]) // 2]),
            "corrupt or truncated png",
        ),
        ("png labelled jpeg", with_(png, codec="jpeg"), "corrupt jpeg"),
        ("jpeg data not bytes", with_(jpeg, data="abc"), "must be bytes"),
        ("jpeg data array", with_(jpeg, data=np.zeros(10, np.uint8)), "must be bytes"),
        ("raw wrong shape", with_(raw, shape=[24, 16, 3]), "does not match the declared"),
        ("raw wrong dtype", with_(raw, data=raw["data"].astype(np.float32)), "dtype float32"),
        ("raw short bytes", with_(raw, data=b"\x00" * 100), "100 bytes does not match"),
        ("raw data str", with_(raw, data="pixels"), "must be an array or bytes"),
    ]


@pytest.mark.parametrize(
    ("label", "msg", "text"),
    bad_messages(),
    ids=lambda v: v if isinstance(v, str) and len(v) < 30 else "",
)
def test_every_bad_message_raises_frame_error_naming_camera(
    label: str, msg: Any, text: str
) -> None:
    with pytest.raises(FrameError) as info:
        decode(msg, name="top")
    assert str(info.value).startswith("camera 'top': ")
    assert text in str(info.value), f"{label}: {info.value}"


def test_raw_bytes_of_the_right_size_decode() -> None:
    frame = noise(5, 6)
    out = decode({"codec": "raw", "shape": [5, 6, 3], "data": frame.tobytes()})
    np.testing.assert_array_equal(out, frame)


def test_unknown_layout_raises() -> None:
    with pytest.raises(FrameError, match="unknown layout 'nchw'"):
        decode(good(), "nchw", name="top")


def test_frame_error_without_a_name_still_reads_well() -> None:
    with pytest.raises(FrameError, match=r"^camera: unknown codec"):
        decode(with_(good(), codec="gif"))

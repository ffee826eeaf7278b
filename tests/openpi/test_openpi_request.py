"""robotd.link.openpi.request: observation windows → openpi requests, replies → rows."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from robotd.config import load_config
from robotd.frames import fit
from robotd.link.openpi.errors import BadReply, RequestError
from robotd.link.openpi.options import ActionsMap, OpenpiOptions
from robotd.link.openpi.request import build_request, parse_reply

DROID = OpenpiOptions.model_validate(
    {
        "inputs": [
            {
                "key": "observation/exterior_image_1_left",
                "source": "exterior",
                "image": {"width": 224, "height": 224},
            },
            {
                "key": "observation/wrist_image_left",
                "source": "wrist",
                "image": {"width": 224, "height": 224},
            },
            {"key": "observation/joint_position", "source": "joints.pos", "joints": "0:7"},
            {"key": "observation/gripper_position", "source": "joints.pos", "joints": [7]},
            {"key": "prompt", "source": "task", "default": "do something"},
        ]
    }
)


def _frame(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 256, size=(h, w, 3), dtype=np.uint8)


def _window(*observations: dict[str, Any]) -> dict[str, Any]:
    return {"observations": list(observations), "steps": list(range(len(observations)))}


def test_droid_request() -> None:
    ext, wrist = _frame(480, 640, 1), _frame(240, 320, 2)
    pos = np.arange(8, dtype=np.float64) / 10
    req = build_request(DROID, _window({"exterior": ext, "wrist": wrist, "joints.pos": pos}), "x")
    assert list(req) == [i.key for i in DROID.inputs]
    img = req["observation/exterior_image_1_left"]
    assert img.shape == (224, 224, 3) and img.dtype == np.uint8
    # resize with pad: a 4:3 frame fills the width, 28-row black bands above and below
    assert not img[:28].any() and not img[-28:].any() and img[28:-28].all(axis=2).mean() > 0.9
    expected = cv2.resize(ext, (224, 168), interpolation=cv2.INTER_AREA)
    assert np.array_equal(img[28:-28], expected)
    assert req["observation/joint_position"].dtype == np.float32
    assert np.array_equal(req["observation/joint_position"], pos[:7].astype(np.float32))
    assert np.array_equal(req["observation/gripper_position"], np.float32([0.7]))
    assert req["prompt"] == "x"
    assert build_request(DROID, _window({"exterior": ext, "wrist": wrist, "joints.pos": pos}))[
        "prompt"
    ] == ("do something")


def test_aloha_nested_chw_and_stacked_windows() -> None:
    opts = OpenpiOptions.model_validate(
        {
            "inputs": [
                {"key": "state", "source": "joints.pos", "dtype": "float64"},
                {
                    "key": ["images", "cam_high"],
                    "source": "top",
                    "image": {"width": 32, "height": 16, "layout": "chw", "resize": "stretch"},
                },
                {"key": ["images", "history"], "source": "top", "window": "stack"},
                {"key": "vel", "source": "joints.vel", "window": "stack", "joints": "1:2"},
            ]
        }
    )
    frames = [_frame(20, 40, s) for s in range(3)]
    window = _window(
        {"top": frames[0], "joints.vel": np.array([0.0, 1.0])},
        {"top": frames[1]},
        {"top": frames[2], "joints.pos": np.ones(14), "joints.vel": np.array([0.0, 3.0])},
    )
    req = build_request(opts, window)
    assert req["state"].dtype == np.float64 and req["state"].shape == (14,)
    chw = req["images"]["cam_high"]
    assert chw.shape == (3, 16, 32) and chw.dtype == np.uint8 and chw.flags.c_contiguous
    hwc = cv2.resize(frames[2], (32, 16), interpolation=cv2.INTER_AREA)
    assert np.array_equal(chw, hwc.transpose(2, 0, 1))
    assert np.array_equal(req["images"]["history"], np.stack(frames))  # as captured
    assert np.array_equal(req["vel"], np.float32([[1.0], [3.0]]))  # the steps holding it


def test_encoded_images() -> None:
    opts = OpenpiOptions.model_validate(
        {"inputs": [{"key": "img", "source": "top", "image": {"codec": "jpeg", "quality": 80}}]}
    )
    jpg = build_request(opts, _window({"top": _frame(30, 40)}))["img"]
    assert isinstance(jpg, bytes)
    assert cv2.imdecode(np.frombuffer(jpg, np.uint8), cv2.IMREAD_COLOR).shape == (30, 40, 3)


@pytest.mark.parametrize(
    "obs, match",
    [
        ({"wrist": _frame(4, 4), "joints.pos": np.ones(8)}, "holds no 'exterior'"),
        ({"exterior": np.zeros((4, 4)), "wrist": _frame(4, 4)}, "HWC uint8"),
        ({"exterior": _frame(4, 4), "wrist": _frame(4, 4), "joints.pos": np.ones(7)}, "past"),
        ({"exterior": _frame(4, 4), "wrist": _frame(4, 4), "joints.pos": "x"}, "numbers"),
        ({"exterior": _frame(4, 4), "wrist": _frame(4, 4), "joints.pos": np.ones((2, 8))}, "vec"),
    ],
)
def test_request_errors_name_the_input(obs: dict[str, Any], match: str) -> None:
    with pytest.raises(RequestError, match=rf"policy\.openpi\.inputs\[\d\].*{match}"):
        build_request(DROID, _window(obs))
    with pytest.raises(RequestError, match="no observations"):
        build_request(DROID, {"observations": [], "steps": []})


selections = st.one_of(
    st.lists(st.integers(0, 11), min_size=1, max_size=12),
    st.tuples(st.integers(0, 11), st.integers(1, 12))
    .filter(lambda t: t[0] < t[1])
    .map(lambda t: f"{t[0]}:{t[1]}"),
)


def _indices(sel: list[int] | str) -> list[int]:
    if isinstance(sel, str):
        a, b = map(int, sel.split(":"))
        return list(range(a, b))
    return sel


@settings(max_examples=200, deadline=None)
@given(
    sel=selections,
    pos=hnp.arrays(np.float64, 12, elements=st.floats(-10, 10)),
    dtype=st.sampled_from(["float32", "float64"]),
)
def test_joint_selection_property(sel: list[int] | str, pos: np.ndarray, dtype: str) -> None:
    opts = OpenpiOptions.model_validate(
        {"inputs": [{"key": "s", "source": "joints.pos", "joints": sel, "dtype": dtype}]}
    )
    got = build_request(opts, _window({"joints.pos": pos}))["s"]
    assert got.dtype == np.dtype(dtype)
    assert np.array_equal(got, pos[_indices(sel)].astype(dtype))


@settings(max_examples=60, deadline=None)
@given(
    h=st.integers(1, 120),
    w=st.integers(1, 120),
    side=st.tuples(st.integers(1, 64), st.integers(1, 64)),
    resize=st.sampled_from(["pad", "crop", "stretch"]),
    layout=st.sampled_from(["hwc", "chw"]),
)
def test_image_fit_property(
    h: int, w: int, side: tuple[int, int], resize: str, layout: str
) -> None:
    """Any frame comes out at the declared size and layout, equal to robotd's own fit."""
    tw, th = side
    spec = {"width": tw, "height": th, "resize": resize, "layout": layout}
    opts = OpenpiOptions.model_validate({"inputs": [{"key": "i", "source": "c", "image": spec}]})
    frame = _frame(h, w)
    got = build_request(opts, _window({"c": frame}))["i"]
    from robotd.contract import Camera

    want = fit(frame, Camera(width=tw, height=th, resize=resize, filter="area"))
    assert got.dtype == np.uint8
    assert np.array_equal(got, want.transpose(2, 0, 1) if layout == "chw" else want)


def test_parse_reply_columns_and_timing() -> None:
    rows = np.arange(40, dtype=np.float32).reshape(5, 8)
    reply = {"actions": rows, "server_timing": {"infer_ms": 12.5, "prev_total_ms": 20.0}}
    ans = parse_reply(ActionsMap(), reply, 8)
    assert ans.rows.dtype == np.float64 and ans.infer_ms == 12.5
    assert np.array_equal(ans.rows, rows) and ans.rows.flags.writeable
    ans = parse_reply(ActionsMap(columns="0:7"), reply, 7)
    assert np.array_equal(ans.rows, rows[:, :7])
    ans = parse_reply(ActionsMap(columns=[0, 1, 6, 6]), {"actions": rows}, 4)
    assert np.array_equal(ans.rows, rows[:, [0, 1, 6, 6]]) and ans.infer_ms is None
    ans = parse_reply(ActionsMap(key="a"), {"a": [[1, 2.5], [3, 4]]}, 2)
    assert np.array_equal(ans.rows, [[1, 2.5], [3, 4]])


@pytest.mark.parametrize(
    "reply, match",
    [
        ([1, 2], "not a map"),
        ({"other": 1}, "no 'actions'"),
        ({"actions": np.zeros((3, 7))}, "7 columns for the robot's 8"),
        ({"actions": np.zeros(8)}, "shape"),
        ({"actions": np.zeros((0, 8))}, "shape"),
        ({"actions": np.zeros((1, 1, 8))}, "shape"),
        ({"actions": np.full((2, 8), np.nan)}, "NaN"),
        ({"actions": np.full((2, 8), np.inf, np.float16)}, "NaN or infinity"),
        ({"actions": "rows"}, "not an H x D"),
        ({"actions": [[1, 2], [3]]}, "equal-length"),
        ({"actions": [[1, "2"]]}, "numbers"),
        ({"actions": [[True] * 8]}, "numbers"),
        ({"actions": np.zeros((20_000, 8))}, "at most"),
    ],
)
def test_parse_reply_refuses(reply: Any, match: str) -> None:
    with pytest.raises(BadReply, match=match):
        parse_reply(ActionsMap(), reply, 8)


def test_parse_reply_columns_past_the_answer() -> None:
    with pytest.raises(BadReply, match="names column 9"):
        parse_reply(ActionsMap(columns=[9]), {"actions": np.zeros((2, 8))}, 1)


@pytest.mark.parametrize(
    "timing",
    [
        None,
        3,
        {"infer_ms": "1"},
        {"infer_ms": -1.0},
        {"infer_ms": float("nan")},
        {"infer_ms": True},
        {},
    ],
)
def test_unusable_timing_is_none(timing: Any) -> None:
    ans = parse_reply(ActionsMap(), {"actions": np.zeros((1, 2)), "server_timing": timing}, 2)
    assert ans.infer_ms is None


hostile = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=5),
        st.binary(max_size=5),
        hnp.arrays(
            st.sampled_from([np.float32, np.int8, np.bool_]),
            hnp.array_shapes(min_dims=0, max_dims=3),
        ),
    ),
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.dictionaries(st.sampled_from(["actions", "server_timing", "infer_ms", "x"]), kids),
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(reply=hostile, cols=st.one_of(st.none(), st.just("0:2"), st.just([1, 1, 0])))
def test_hostile_replies_raise_only_bad_reply(reply: Any, cols: Any) -> None:
    joints = 3 if isinstance(cols, list) else 2
    try:
        ans = parse_reply(ActionsMap(columns=cols), reply, joints)
    except BadReply:
        return
    assert ans.rows.shape[1] == joints and np.isfinite(ans.rows).all()


@pytest.mark.parametrize("name", ["droid", "aloha", "libero"])
def test_example_configs_build_requests(name: str) -> None:
    cfg = load_config(f"config/openpi-{name}.toml")
    obs: dict[str, Any] = {c: _frame(cam.height, cam.width) for c, cam in cfg.cameras.items()}
    obs["joints.pos"] = np.zeros(len(cfg.joints.names))
    req = build_request(cfg.policy.openpi, _window(obs), "task text")
    assert req["prompt"] == "task text"
    images = [v for v in _flat(req) if isinstance(v, np.ndarray) and v.ndim == 3]
    assert images and all(sorted(v.shape) == [3, 224, 224] for v in images)


def _flat(d: dict[str, Any]) -> list[Any]:
    return [x for v in d.values() for x in (_flat(v) if isinstance(v, dict) else [v])]


def test_rtc_fields_go_under_the_configured_keys() -> None:
    rtc = {"delay": 4, "prefix": np.arange(6.0).reshape(2, 3), "rest": np.ones((1, 3))}
    pos = np.zeros(8)
    window = _window({"joints.pos": pos})
    plain = OpenpiOptions.model_validate({"inputs": [{"key": "state", "source": "joints.pos"}]})
    assert build_request(plain, window, rtc=rtc).keys() == {"state"}  # no table: nothing sent
    opts = OpenpiOptions.model_validate(
        {"inputs": [{"key": "state", "source": "joints.pos"}], "rtc": {}}
    )
    req = build_request(opts, window, rtc=rtc)
    assert req["inference_delay"] == 4 and "rest" not in req
    assert req["prefix"].dtype == np.float32 and np.array_equal(req["prefix"], rtc["prefix"])
    assert build_request(opts, window).keys() == {"state"}  # an act without rtc (sync)
    nested = OpenpiOptions.model_validate(
        {
            "inputs": [{"key": "state", "source": "joints.pos"}],
            "rtc": {"prefix": ["rtc", "frozen"], "delay": ["rtc", "d"], "rest": "guide"},
        }
    )
    req = build_request(nested, window, rtc=rtc)
    assert req["rtc"]["d"] == 4 and req["rtc"]["frozen"].shape == (2, 3)
    assert req["guide"].shape == (1, 3)


@pytest.mark.parametrize(
    ("rtc", "match"),
    [
        ({"delay": 0, "prefix": np.zeros((0, 3)), "rest": np.zeros((0, 3))}, "rtc.delay"),
        ({"delay": 2, "prefix": [1.0], "rest": np.zeros((0, 3))}, "rtc.prefix"),
    ],
)
def test_malformed_rtc_fields_name_the_field(rtc: dict, match: str) -> None:
    opts = OpenpiOptions.model_validate(
        {"inputs": [{"key": "state", "source": "joints.pos"}], "rtc": {}}
    )
    with pytest.raises(RequestError, match=match):
        build_request(opts, _window({"joints.pos": np.zeros(3)}), rtc=rtc)


def test_rtc_keys_may_not_clash_with_inputs() -> None:
    with pytest.raises(ValueError, match=r"rtc\.prefix: \['prefix'\] clashes with inputs\[0\]"):
        OpenpiOptions.model_validate(
            {"inputs": [{"key": "prefix", "source": "joints.pos"}], "rtc": {}}
        )
    with pytest.raises(ValueError, match="non-empty string"):
        OpenpiOptions.model_validate({"inputs": [], "rtc": {"delay": ""}})

"""The trace's channels: one topic per event kind, each with the JSON schema of its records.

This table is the one place that says what a trace holds; the daemon maps its lane
messages onto these fields. Every record is a JSON object; arrays of numbers are plain
JSON arrays so that a viewer (Foxglove's Plot panel: ``/robot/tick.pos[0]``) can plot
them. Frames use Foxglove's own ``foxglove.CompressedImage`` schema so the Image panel
shows them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

TICK = "/robot/tick"
ASK = "/policy/ask"
CHUNK = "/policy/chunk"
EVENTS = "/events"
OPERATOR = "/operator"
LINK = "/link"
START_STATE = "/robot/start_state"
CAMERA_PREFIX = "/camera/"

SHIELD_KINDS = ("", "clipped", "clamped", "rejected")
CHUNK_RESULTS = ("merged", "stale", "bad", "discarded")
LINK_KINDS = ("upload", "refusal", "reconnect", "episode_reset")

# Names of the /events records the trace itself writes.
EPISODE_START = "episode_start"
EPISODE_END = "episode_end"
TRACE_DROP = "trace_drop"
# The outcome of an episode whose file has no end: the daemon stopped without ending it
# (killed, crashed, the power cut); its file holds what was flushed before that.
CUT_OFF = "cut_off"
# The outcome of an episode running when the control lane died (killed, crashed): the main
# process ends its file, the cause saying how the lane ended; the lane never said.
LANE_LOST = "lane_lost"

_NUM = {"type": ["number", "null"]}  # null: a non-finite value (see robotd.trace.codec)
_NUMS = {"type": "array", "items": _NUM}
_INT = {"type": "integer"}
_STR = {"type": "string"}
_OBJ = {"type": "object"}


def _object(title: str, description: str, props: dict[str, Any]) -> dict[str, Any]:
    return {
        "title": title,
        "description": description,
        "type": "object",
        "properties": props,
        "required": list(props),
    }


@dataclass(frozen=True)
class ChannelSpec:
    """One channel: its topic, schema name and JSON schema (as bytes for MCAP)."""

    topic: str
    schema_name: str
    schema: dict[str, Any]

    @property
    def schema_bytes(self) -> bytes:
        return json.dumps(self.schema, sort_keys=True).encode()


_TICK = _object(
    "robotd.Tick",
    "One control tick: the joint state read, the target written after the shield.",
    {
        "ep": _INT,  # operator-level episode
        "wep": _STR,  # worker-side episode id
        "s": _INT,  # step within the worker-side episode
        "t_ns": _INT,  # the tick's deadline on the lane's clock
        "pos": _NUMS,
        "vel": _NUMS,
        "target": {"type": ["array", "null"], "items": _NUM},
        "held": {"type": "boolean"},
        "shield": {"type": "string", "enum": list(SHIELD_KINDS)},
        "ok": {"type": "boolean"},  # the observation was valid
        "skipped": {"type": "boolean"},  # an overrun: the tick was skipped
        "tick": _INT,  # the kernel's tick count (a gap: ticks whose joint read failed)
        # each camera's newest frame at the tick: [frame index, capture time ns] or null
        "cams": {"type": "object", "additionalProperties": {
            "type": ["array", "null"], "items": _INT}},
    },
)
_ASK = _object(
    "robotd.Ask",
    "An act asked from step s with the queue depth, the predicted delay in steps (0: none)"
    " and the rows of its frozen prefix.",
    {"id": _INT, "wep": _STR, "s": _INT, "queue": _INT, "delay": _INT, "frozen": _INT},
)
_CHUNK = _object(
    "robotd.Chunk",
    "A chunk computed from step `from`, arriving at step `at`, as handed to the control lane.",
    {
        "ask": _INT,
        "wep": _STR,
        "from": _INT,
        "at": {"type": ["integer", "null"]},  # null: never merged (bad, discarded)
        "rows": {"type": "array", "items": _NUMS},
        "dropped": _INT,  # rows already in the past when it arrived
        "stale": {"type": "boolean"},  # wholly in the past: discarded
        "result": {"type": "string", "enum": list(CHUNK_RESULTS)},
        "tick": {"type": ["integer", "null"]},  # bad or discarded: the tick that said so
    },
)
_EVENT = _object(
    "robotd.Event",
    "Faults, resets, holds, shield interventions, episode start and end, trace drops.",
    {"name": _STR, "tick": {"type": ["integer", "null"]}, "detail": _OBJ},
)
_OPERATOR = _object(
    "robotd.OperatorCommand",
    "An operator command, its arguments in summary and how it was answered.",
    {"cmd": _STR, "args": _OBJ, "ok": {"type": "boolean"}, "error": {"type": ["string", "null"]}},
)
# Only when the arguments held what JSON cannot (bytes): where they were made printable.
_OPERATOR["properties"]["sanitized"] = {"type": "array", "items": _STR}
_LINK = _object(
    "robotd.LinkEvent",
    "The policy link: uploads, refusals, reconnects, worker-side episode resets.",
    {"kind": {"type": "string", "enum": list(LINK_KINDS)}, "detail": _OBJ},
)
_VEC_OR_NULL = {"type": ["array", "null"], "items": _NUM}
_START_STATE = _object(
    "robotd.StartState",
    "What the control kernel held as the episode started: where a replay starts from.",
    {
        "ep": _INT, "wep": _STR, "run_id": _STR, "wep_n": _INT, "tick": _INT,
        "last": _VEC_OR_NULL, "last_step": _VEC_OR_NULL, "rejections": _INT,
        "ask_id": _INT, "retry_at": _INT,
        "open_loop_horizon": {"type": ["integer", "null"]},
        "torque": {"type": "boolean"}, "anchored": {"type": "boolean"},
        "skip": _INT, "read_failures": _INT, "task": _STR, "rtc": {"type": "boolean"},
        "delays": {"type": "array", "items": _INT},
    },
)
# Foxglove's published JSON schema for foxglove.CompressedImage (plus frame_index, ours).
COMPRESSED_IMAGE = {
    "title": "foxglove.CompressedImage",
    "description": "A compressed image",
    "type": "object",
    "properties": {
        "timestamp": {
            "type": "object",
            "title": "time",
            "properties": {
                "sec": {"type": "integer", "minimum": 0},
                "nsec": {"type": "integer", "minimum": 0, "maximum": 999999999},
            },
            "description": "Timestamp of image",
        },
        "frame_id": {"type": "string", "description": "Frame of reference for the image"},
        "data": {
            "type": "string",
            "contentEncoding": "base64",
            "description": "Compressed image data",
        },
        "format": {"type": "string", "description": "Image format: jpeg, png, webp, avif"},
        "frame_index": {"type": "integer", "description": "robotd: the camera's frame index"},
    },
}

CHANNELS: dict[str, ChannelSpec] = {
    spec.topic: spec
    for spec in (
        ChannelSpec(TICK, "robotd.Tick", _TICK),
        ChannelSpec(ASK, "robotd.Ask", _ASK),
        ChannelSpec(CHUNK, "robotd.Chunk", _CHUNK),
        ChannelSpec(EVENTS, "robotd.Event", _EVENT),
        ChannelSpec(OPERATOR, "robotd.OperatorCommand", _OPERATOR),
        ChannelSpec(LINK, "robotd.LinkEvent", _LINK),
        ChannelSpec(START_STATE, "robotd.StartState", _START_STATE),
    )
}


def camera_topic(camera: str) -> str:
    """The topic of a camera's frames: ``/camera/<name>``."""
    return CAMERA_PREFIX + camera


def is_camera_topic(topic: str) -> bool:
    return topic.startswith(CAMERA_PREFIX) and len(topic) > len(CAMERA_PREFIX)


def valid_camera_name(camera: object) -> bool:
    """A camera name as the config allows it: alphanumeric, - and _, at most 64 characters."""
    return (
        isinstance(camera, str)
        and 0 < len(camera) <= 64
        and camera.replace("_", "").replace("-", "").isalnum()
        and camera.isascii()
    )


def spec_for(topic: str) -> ChannelSpec | None:
    """The channel of a topic (cameras made on demand), or None for a topic not in the table."""
    spec = CHANNELS.get(topic)
    if spec is None and is_camera_topic(topic) and valid_camera_name(topic[len(CAMERA_PREFIX) :]):
        spec = ChannelSpec(topic, "foxglove.CompressedImage", COMPRESSED_IMAGE)
    return spec

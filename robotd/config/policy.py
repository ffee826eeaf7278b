"""The [policy] section: which policy, where it runs, how robotd reaches it and waits on it.

The link (robotd's own, or an openpi server with its [policy.openpi] mapping), the worker's
endpoint or the local worker's MODULE:CLASS and copies, and every wait and bound of an act:
its timeout, the uploads' wait, a chunk's rows, the heartbeat, the reconnect backoff, when
a copy counts as hung. The hang bounds are shared with `robotd serve --hang-s` (robotd.cli),
so they and their words live here, with the one section that sets them in a config.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from robotd.config.fields import ConfigModel
from robotd.link.openpi.options import OpenpiOptions
from robotd.stream.endpoint import worker_problem

# policy.hang_s's floor, and `robotd serve --hang-s`'s: the worker kills a copy whose call
# (an act with its reset, an end) is unanswered this long (robotd/worker/copies.py). An act
# is a pipe round trip and the policy's forward pass: ~1 ms for the demo, ~10 ms for ACT on
# a GPU, 100 ms and more for a large model. Below this floor even small policies' copies,
# merely computing, would be killed at every hiccup; above it, what a heavy policy needs is
# the config's (or the command line's) to say.
HANG_MIN_S = 0.1
HANG_MAX_S = 600.0  # ten minutes: past any first act's warm-up


def hang_floor_problem(value: float) -> str | None:
    """The bounds' rule in words when `value` (seconds) breaks one, else None: one wording
    for the config's policy.hang_s and the serve command's --hang-s."""
    if value < HANG_MIN_S:
        return (
            f"must be >= {HANG_MIN_S:g} s, got {value!r}: shorter, a copy still computing an "
            "ordinary act would be killed as hung"
        )
    if value > HANG_MAX_S:
        return f"must be <= {HANG_MAX_S:g} s, got {value!r}: a copy silent that long is hung"
    return None


_DOTTED = r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*"
POLICY_SPEC = re.compile(f"{_DOTTED}:{_DOTTED}")


class OpenpiConfig(OpenpiOptions):
    """[policy.openpi], used with policy.link = "openpi": the request mapping (inputs),
    the action mapping, API key, timeouts and backoff (robotd.link.openpi.options)."""


class PolicyConfig(ConfigModel):
    # robotd: robotd's own link to `robotd serve` (over its byte stream or ZeroMQ, as the
    # endpoint says; "zmq", its name before the stream, is taken for it); openpi: an openpi
    # websocket policy server
    link: Literal["robotd", "openpi"] = "robotd"
    worker: str = ""  # endpoint of a remote worker (ws://host:8000 for openpi); empty = local
    serve: str = "robotd.demo:DotFollower"  # MODULE:CLASS for the local worker
    args: dict[str, Any] = {}
    # an act's answer (+ stream_wait_s for uploaded windows), whose wait the robot holds or
    # plays out its queue through: 10 minutes is past any first act (a JIT warm-up included)
    # and matches stream_wait_s's and hang_s's caps; more is a typo
    timeout_s: float = Field(10.0, gt=0, le=600)
    # at most the wait an act may ask of the worker (robotd.worker.requests.MAX_WAIT_S)
    stream_wait_s: float = Field(10.0, gt=0, le=600)
    # a chunk's rows, as answered and at the control rate; more is refused whole
    max_chunk_rows: int = Field(1024, ge=1, le=4096)
    # no answer to the worker's heartbeat this long: gone (the robot holds, reconnect)
    heartbeat_s: float = Field(2.0, gt=0, le=60)
    # the wait at start for the worker's first hello: a local worker's start is its policy
    # loading (a checkpoint can take minutes on a small computer), a remote one's coming up
    start_s: float = Field(30.0, gt=0, le=600)
    reconnect_max_s: float = Field(5.0, gt=0, le=300)  # the reconnect backoff's cap
    # the local worker (no policy.worker): copies of the policy in child processes (a
    # second is a warm spare, ready at once when one is lost) and when a copy counts as hung
    # (shorter than control.max_hold_steps / hz; unset, capped at half of it: model.py)
    copies: int = Field(2, ge=0, le=16)
    hang_s: float = 5.0  # HANG_MIN_S to HANG_MAX_S (_hang: the serve command's words too)
    # a copy's first call, its policy's warm-up (JIT compilation, CUDA kernels, caches: tens
    # of seconds once), is a hang only past this when longer than hang_s; same bounds
    first_call_s: float = 60.0
    # uploads one episode may hold on the worker (in flight), lowered to the worker's own
    max_episode_frames: int = Field(1024, ge=1)
    max_episode_bytes: int = Field(64 << 20, ge=1)
    # for servers that cannot declare their contract (openpi): validated by robotd.contract
    observations: dict[str, Any] | None = None
    actions: dict[str, Any] | None = None
    openpi: OpenpiConfig = OpenpiConfig()

    @field_validator("link", mode="before")
    @classmethod
    def _old_link_name(cls, value: Any) -> Any:
        return "robotd" if value == "zmq" else value

    @field_validator("hang_s", "first_call_s")
    @classmethod
    def _hang(cls, value: float) -> float:
        problem = hang_floor_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("serve")
    @classmethod
    def _serve(cls, value: str, info: ValidationInfo) -> str:
        """What the local worker imports (not checked for a remote worker, which serves
        what it was started with)."""
        local = info.data.get("link") == "robotd" and not info.data.get("worker")
        if local and not POLICY_SPEC.fullmatch(value):
            raise ValueError(
                f"{value!r} is not MODULE:CLASS (the local worker imports MODULE and serves "
                "its CLASS, e.g. 'robotd.demo:DotFollower')"
            )
        return value

    @model_validator(mode="after")
    def _worker_endpoint(self) -> PolicyConfig:
        ep = self.worker
        if self.link != "robotd" or not ep:
            return self
        if (problem := worker_problem(ep)) is not None:
            raise ValueError(f"worker: {problem}")
        return self

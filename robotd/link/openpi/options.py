"""The `[policy.openpi]` table: how robotd's observation maps onto an openpi server's
request, how its answer maps onto the robot's joints, and how the link connects.

Validated by pydantic at load (unknown keys are errors); `OpenpiOptions.check` adds the
rules that need the rest of the config (camera names, joint count, the endpoint) and
raises ValueError naming the key, e.g. ``policy.openpi.inputs[2].source: ...``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from robotd.stream.endpoint import port_problem

JOINT_SOURCES = ("joints.pos", "joints.vel")
TASK = "task"
MAX_JOINTS = 1024
MAX_INPUTS = 64
MAX_ROWS = 10_000  # action rows one answer may hold


def _selection_kind(value: Any) -> Any:
    """A selection's kind and bounds in one rule (before the union, which would say what is
    wrong once per member, under its member's name: joints.list[constrained-int][0])."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(type(i) is int for i in value):
        bad = [i for i in value if not 0 <= i < MAX_JOINTS]
        if bad:
            raise ValueError(f"indices must be 0..{MAX_JOINTS - 1}, got {bad}")
        return value
    raise ValueError(
        f"must be a slice 'start:stop' or an array of indices (integers), got {value!r:.60}"
    )


def _server_key_kind(value: Any) -> Any:
    """A server key is a string or an array of strings (one rule, as _selection_kind)."""
    if isinstance(value, str) or (
        isinstance(value, list) and all(isinstance(p, str) for p in value)
    ):
        return value
    raise ValueError(f"must be a string or an array of strings, got {value!r:.60}")


ServerKey = Annotated[str | list[str], BeforeValidator(_server_key_kind)]

# A joint or column selection: a list of indices, or a "start:stop" slice.
Selection = Annotated[
    list[Annotated[int, Field(ge=0, lt=MAX_JOINTS)]] | str, BeforeValidator(_selection_kind)
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_selection(sel: list[int] | str) -> tuple[int, ...]:
    """The indices a selection names, in order: [0, 2, 5] as given (an index may repeat:
    one gripper value for two finger joints), "0:7" as 0..6. ValueError for an empty,
    reversed or malformed selection."""
    if isinstance(sel, str):
        start, sep, stop = sel.partition(":")
        try:
            a, b = int(start), int(stop)
        except ValueError:
            a = b = -1
        if not sep or not 0 <= a < b <= MAX_JOINTS:
            raise ValueError(
                f"{sel!r} is not a slice 'start:stop' with 0 <= start < stop <= {MAX_JOINTS}"
            )
        return tuple(range(a, b))
    if not sel:
        raise ValueError("an empty list selects nothing")
    return tuple(sel)


class ImageSpec(_Model):
    """How one camera's frame is fitted and encoded robot-side for the server. openpi's
    own clients resize with pad (letterbox) to 224x224 with PIL's bilinear, which
    antialiases when it shrinks, and send HWC uint8: cv2's `area` is the closest of cv2's
    filters to that (tests/openpi/test_openpi_resize.py), `linear` does not antialias."""

    width: int | None = Field(None, gt=0, le=8192)
    height: int | None = Field(None, gt=0, le=8192)
    resize: Literal["stretch", "crop", "pad"] = "pad"
    filter: Literal["area", "linear", "cubic"] = "area"
    codec: Literal["raw", "jpeg", "png"] = "raw"  # raw: a uint8 array; jpeg/png: bytes
    quality: int = Field(90, ge=1, le=100)
    layout: Literal["hwc", "chw"] = "hwc"  # ALOHA servers take CHW uint8

    @model_validator(mode="after")
    def _check(self) -> ImageSpec:
        if (self.width is None) != (self.height is None):
            raise ValueError("width and height go together (give both or neither)")
        if self.codec != "raw" and self.layout != "hwc":
            raise ValueError(f"layout 'chw' needs codec 'raw' (a {self.codec} image is HWC)")
        return self


class Input(_Model):
    """One entry of the server's request: `key` (a string, or a list of strings for a
    path into nested maps, e.g. ["images", "cam_high"]) filled from `source` (a camera
    name, joints.pos, joints.vel, or task: the episode's task text)."""

    key: ServerKey
    source: str = Field(min_length=1)
    joints: Selection | None = None  # joint sources: which joints, in order (default all)
    dtype: Literal["float32", "float64"] = "float32"  # joint sources
    image: ImageSpec | None = None  # camera sources (default: as captured, HWC uint8)
    window: Literal["last", "stack"] = "last"  # stack: every window step, on a new axis 0
    default: str = ""  # task: the prompt when the episode has no task text

    @field_validator("key")
    @classmethod
    def _key(cls, v: str | list[str]) -> str | list[str]:
        parts = [v] if isinstance(v, str) else v
        if not parts or any(not p for p in parts):
            raise ValueError("a server key must be a non-empty string or list of them")
        return v

    @field_validator("joints")
    @classmethod
    def _joints(cls, v: list[int] | str | None) -> list[int] | str | None:
        if v is not None:
            parse_selection(v)
        return v

    @property
    def path(self) -> tuple[str, ...]:
        return (self.key,) if isinstance(self.key, str) else tuple(self.key)

    @property
    def is_camera(self) -> bool:
        return self.source not in (*JOINT_SOURCES, TASK)

    @model_validator(mode="after")
    def _check(self) -> Input:
        if self.joints is not None and self.source not in JOINT_SOURCES:
            raise ValueError(f"joints: only for sources {JOINT_SOURCES}, not {self.source!r}")
        if self.image is not None and not self.is_camera:
            raise ValueError(f"image: only for camera sources, not {self.source!r}")
        if self.default and self.source != TASK:
            raise ValueError(f"default: only for source 'task', not {self.source!r}")
        if self.window == "stack" and self.source == TASK:
            raise ValueError("window: the task text has no window; use 'last'")
        return self


class ActionsMap(_Model):
    """Where the answer's rows are (`key`, H x D) and which of their D columns drive the
    robot's joints, in joint order (`columns`: indices or "start:stop"; default all)."""

    key: str = Field("actions", min_length=1)
    columns: Selection | None = None

    @field_validator("columns")
    @classmethod
    def _columns(cls, v: list[int] | str | None) -> list[int] | str | None:
        if v is not None:
            parse_selection(v)
        return v

    def column_indices(self) -> tuple[int, ...] | None:
        return None if self.columns is None else parse_selection(self.columns)


def _key_path(v: ServerKey | None) -> tuple[str, ...]:
    return () if v is None else (v,) if isinstance(v, str) else tuple(v)


class RtcKeys(_Model):
    """[policy.openpi.rtc]: where real-time chunking's fields go in each request, for a
    server that takes them: `prefix` the frozen rows (p x joints, in joint order, float32),
    `delay` the predicted delay in rows at the server's rate, `rest` the queued rows after
    the prefix (unset: not sent). A key is a string or a path into nested maps."""

    prefix: ServerKey = "prefix"
    delay: ServerKey = "inference_delay"
    rest: ServerKey | None = None

    @field_validator("prefix", "delay", "rest")
    @classmethod
    def _key(cls, v: ServerKey | None) -> ServerKey | None:
        parts = _key_path(v)
        if v is not None and (not parts or any(not p for p in parts)):
            raise ValueError("a server key must be a non-empty string or list of them")
        return v

    def paths(self) -> dict[str, tuple[str, ...]]:
        """field ("prefix", "delay", "rest") -> its key path, for the fields sent."""
        given = {"prefix": self.prefix, "delay": self.delay, "rest": self.rest}
        return {name: _key_path(v) for name, v in given.items() if v is not None}


class OpenpiOptions(_Model):
    """policy.openpi: request mapping, action mapping, auth, timeouts and backoff."""

    inputs: list[Input] = Field([], max_length=MAX_INPUTS)
    actions: ActionsMap = ActionsMap()
    rtc: RtcKeys | None = None  # unset: the server is sent no real-time chunking fields
    # Authorization: Api-Key <key>, from the key itself or from an environment variable
    api_key: SecretStr = SecretStr("")
    api_key_env: str = ""
    connect_timeout_s: float = Field(10.0, gt=0, le=600)  # handshake + metadata frame
    backoff_initial_s: float = Field(0.25, gt=0, le=60)
    backoff_max_s: float = Field(5.0, gt=0, le=600)
    healthz: str = "/healthz"  # polled before each connection attempt; "" = do not poll
    ca_file: str = ""  # wss://: a CA bundle to verify the server with (default: the system's)
    max_reply_bytes: int = Field(64 << 20, ge=1 << 10, le=1 << 30)  # one incoming frame
    # a ping this often; no pong within as long again drops the connection (0: no pings)
    keepalive_s: float = Field(20.0, ge=0, le=600)
    # after each connect, one inference shaped as a first act (neutral contents) is sent and
    # its answer discarded, waited for this long, acts waiting behind it: openpi's servers
    # JIT-compile on their first inference, which can take longer than an act's timeout
    # (robotd.link.openpi.warmup). 0: no warm-up; 600 matches policy.timeout_s's cap
    warmup_s: float = Field(120.0, ge=0, le=600)

    @model_validator(mode="after")
    def _check(self) -> OpenpiOptions:
        if self.api_key.get_secret_value() and self.api_key_env:
            raise ValueError("api_key and api_key_env: give one or the other")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(
                f"backoff_max_s {self.backoff_max_s} is below backoff_initial_s "
                f"{self.backoff_initial_s}"
            )
        if self.healthz and not self.healthz.startswith("/"):
            raise ValueError(f"healthz: {self.healthz!r} must be a path starting with '/'")
        named = [(f"inputs[{n}].key", i.path) for n, i in enumerate(self.inputs)]
        if self.rtc is not None:
            named += [(f"rtc.{field}", path) for field, path in self.rtc.paths().items()]
        for n, (where, p) in enumerate(named):
            for other, q in named[:n]:
                if p == q or p[: len(q)] == q or q[: len(p)] == p:
                    raise ValueError(
                        f"{where}: {list(p)} clashes with {other} {list(q)} "
                        "(the same key, or one inside the other)"
                    )
        return self

    def check(
        self,
        worker: str,
        cameras: Collection[str],
        joints: int,
        streams: Collection[str] | None = None,
    ) -> None:
        """ValueError with every problem `problems` finds, one a line."""
        found = self.problems(worker, cameras, joints, streams)
        if found:
            raise ValueError("\n".join(found))

    def problems(
        self,
        worker: str,
        cameras: Collection[str],
        joints: int,
        streams: Collection[str] | None = None,
    ) -> list[str]:
        """The rules that need the rest of the config, every one broken (``KEY: why``):
        `worker` is ws:// or wss://, every source exists (`cameras`, the joint sources,
        task) and is read by the declared `streams` (None: no contract declared, every
        source is read), joint selections and action columns fit `joints`."""
        found = _worker_problems(worker)
        if not self.inputs:
            found.append("policy.openpi.inputs: map at least one observation key")
        known = [*cameras, *JOINT_SOURCES, TASK]
        for n, inp in enumerate(self.inputs):
            where = f"policy.openpi.inputs[{n}]"
            if inp.source not in known:
                found.append(f"{where}.source: {inp.source!r} is not one of {known}")
            elif streams is not None and inp.source != TASK and inp.source not in streams:
                found.append(
                    f"{where}.source: {inp.source!r} is not read by policy.observations "
                    f"(streams {sorted(streams)})"
                )
            if inp.joints is not None:
                worst = max(parse_selection(inp.joints))
                if worst >= joints:
                    found.append(
                        f"{where}.joints: index {worst} is past the robot's {joints} joints"
                    )
        cols = self.actions.column_indices()
        if cols is not None and len(cols) != joints:
            found.append(
                f"policy.openpi.actions.columns: selects {len(cols)} columns for the "
                f"robot's {joints} joints"
            )
        return found

    def api_key_value(self, environ: dict[str, str] | Any) -> str:
        """The API key to send ("" for none); ValueError if api_key_env names an unset
        variable. `environ`: os.environ or a stand-in."""
        if self.api_key_env:
            value = environ.get(self.api_key_env, "")
            if not value:
                raise ValueError(
                    f"policy.openpi.api_key_env: environment variable {self.api_key_env!r} "
                    "is not set"
                )
            return value
        return self.api_key.get_secret_value()


def _worker_problems(worker: str) -> list[str]:
    """policy.worker for the openpi link: a ws:// or wss:// URL (one urlsplit can parse: an
    unclosed [IPv6] host is none) with a port in range."""
    scheme = worker.partition("://")[0].lower() if "://" in worker else ""
    if scheme not in ("ws", "wss"):
        return [
            f"policy.worker: the openpi link needs a ws:// or wss:// endpoint "
            f"(e.g. ws://gpu-box:8000), got {worker!r}"
        ]
    try:
        urlsplit(worker)
    except ValueError as exc:
        return [f"policy.worker: {worker!r} is not a URL ({exc})"]
    problem = port_problem(worker)
    return [] if problem is None else [f"policy.worker: {problem}"]

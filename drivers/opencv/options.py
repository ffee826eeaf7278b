"""An OpenCV camera's options (`OpenCVOptions`, validated at load) and what its source must
be before anything runs (`preflight`: `robotd check`, through `OpenCVCamera.preflight`): a
file that exists and decodes, a /dev path or device index that names a device, a stream
URL well formed and of a scheme OpenCV opens, unless the fallback serves instead. Nothing
is connected to, no device opened (the running daemon may hold it). A password in a URL is
never shown."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal
from urllib.parse import SplitResult, unquote, urlsplit

import pydantic

from drivers.base import DriverOptions, exact_kind
from drivers.opencv.source import probe


class OpenCVOptions(DriverOptions):
    source: int | str = 0  # device index, /dev/videoN, a video file, or a URL
    fourcc: str = "MJPG"  # asked of a device; "" leaves the device's own
    backend: Literal["any", "v4l2", "ffmpeg"] = "any"
    fit: Literal["stretch", "crop", "pad"] = "stretch"
    loop: bool = True  # a file starts again at its end (else: it ended, reconnect)
    fallback: str = "none"  # none | pattern | a video file, when the source is absent at open
    reconnect_timeout_s: float = pydantic.Field(30.0, gt=0)
    backoff_min_s: float = pydantic.Field(0.1, gt=0)
    backoff_max_s: float = pydantic.Field(2.0, gt=0)

    @pydantic.field_validator("source", mode="before")
    @classmethod
    def _source(cls, value: object) -> int | str:
        # one rule for the union: `source = true` is no device 1, nor 1.0 device 1
        said = "a device index (an integer) or a path or URL (a string)"
        value = exact_kind(value, (int, str), said)
        if isinstance(value, int) and value < 0:
            raise ValueError(f"a device index is >= 0, got {value}")
        if isinstance(value, str) and not value.strip():
            raise ValueError("an empty source")
        return value

    @pydantic.field_validator("fourcc")
    @classmethod
    def _fourcc(cls, value: str) -> str:
        if value and (len(value) != 4 or not value.isascii()):
            raise ValueError(f"a FOURCC is 4 ASCII characters (MJPG, YUYV), got {value!r}")
        return value


# The URL schemes an OpenCV camera's source may have: what OpenCV's FFmpeg backend opens
# (file: a local file named as a URL). A typo ("rstp") never connects, and says nothing
# more useful at run than "cannot be opened" once a second.
STREAM_SCHEMES = ("rtsp", "rtsps", "http", "https", "udp", "tcp", "rtmp")
# udp and tcp may listen: a host is optional there (udp://@:5000), a port is not
LISTENING = ("udp", "tcp")
# OpenCV reads a device index of 100 and more, with backend "any", as a backend's id plus
# an index (200: V4L2's device 0), its older spelling: such an index is not checked.
INDEX_OFFSETS = 100


def preflight(
    options: OpenCVOptions, config_dir: Path | None, devices: Path = Path("/dev")
) -> str | None:
    """A source that can never deliver, without a usable fallback: a file that is missing
    or does not decode, a /dev path naming nothing (`probe`), then what `source_problem`
    finds. None when fine, else "source: SOURCE: why"."""
    source = beside_config(options.source, config_dir)
    why = probe(source, options.backend)
    if why is not None:
        return unless_fallback(f"source: {source}: {why}", options, config_dir)
    return source_problem(options, config_dir, devices)


def source_problem(
    options: OpenCVOptions, config_dir: Path | None, devices: Path = Path("/dev")
) -> str | None:
    """What `probe` leaves: a device index (Linux: /dev/videoN under `devices`) naming no
    device, without a usable fallback (as for a missing /dev path); a stream URL that is
    malformed or of a scheme OpenCV does not open (whatever the fallback: a typo, not an
    absent camera). Not connected to. None when fine, else "source: SOURCE: why"."""
    source = options.source
    if isinstance(source, str) and "://" in source:
        return _url_problem(source, options.backend)
    if not isinstance(source, int):
        return None
    if not sys.platform.startswith("linux") or options.backend == "ffmpeg":
        return None  # no /dev/videoN to look at (FFmpeg opens no index at all)
    if options.backend == "any" and source >= INDEX_OFFSETS:
        return None
    device = devices / f"video{source}"
    if device.exists():
        return None
    problem = f"source: {source}: no such device ({device})"
    return unless_fallback(problem, options, config_dir)


def unless_fallback(problem: str, options: OpenCVOptions, config_dir: Path | None) -> str | None:
    """`problem` (a source that can never deliver), unless the camera's fallback serves
    instead: None with the pattern, else the problem, and the fallback's own when it is a
    source that cannot deliver either."""
    if options.fallback == "pattern":
        return None
    if options.fallback == "none":
        return problem
    fallback = beside_config(options.fallback, config_dir)
    also = probe(fallback, "any")
    return None if also is None else f"{problem}; and fallback: {fallback}: {also}"


def beside_config(source: int | str, config_dir: Path | None) -> int | str:
    """A relative file path names a file beside the robot's config, not one in the
    daemon's working directory."""
    if not isinstance(source, str) or config_dir is None or "://" in source:
        return source
    path = Path(source)
    return source if path.is_absolute() else str(config_dir / path)


def _url_problem(source: str, backend: str) -> str | None:
    try:
        url = urlsplit(source)
    except ValueError as exc:  # an unclosed [IPv6] host: no URL at all (nothing to show)
        return f"source: {_hidden(source)}: a malformed URL ({exc})"
    shown = _shown(source, url)
    scheme = url.scheme.lower()
    if any(c.isspace() for c in source):
        return f"source: {shown}: a URL has no blanks"
    if scheme == "file":
        why = probe(unquote(url.path), backend)
        return None if why is None else f"source: {shown}: {why}"
    if scheme not in STREAM_SCHEMES:
        known = ", ".join((*STREAM_SCHEMES, "file"))
        return f"source: {shown}: scheme {scheme!r} is not one OpenCV opens ({known})"
    try:
        port = url.port
    except ValueError as exc:
        return f"source: {shown}: a bad port ({exc})"
    if not url.hostname and not (scheme in LISTENING and port):
        need = "a host or a port" if scheme in LISTENING else "a host"
        return f"source: {shown}: no host in the URL ({scheme}:// needs {need})"
    return None


def _hidden(source: str) -> str:
    """A URL that cannot be parsed as an error shows it: what lies between its scheme and
    the last @ (a user and password) replaced by ***."""
    scheme, sep, rest = source.partition("://")
    netloc, slash, path = rest.partition("/")
    _user, at, host = netloc.rpartition("@")
    return f"{scheme}{sep}***@{host}{slash}{path}" if at else source


def _shown(source: str, url: SplitResult) -> str:
    """The URL as an error shows it: as written, a password it holds replaced by ***."""
    if not url.password:
        return source
    return source.replace(f":{url.password}@", ":***@", 1)

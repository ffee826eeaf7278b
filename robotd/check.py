"""`robotd check`: what start-up would refuse besides the config's own rules (a run
directory that cannot be made or is not the daemon's own, a camera source that can never
deliver), then the resolved config."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, unquote, urlsplit

from robotd.config import Config

if TYPE_CHECKING:
    from drivers.opencv.camera import OpenCVOptions

# The URL schemes an OpenCV camera's source may have: what OpenCV's FFmpeg backend opens
# (file: a local file named as a URL). A typo ("rstp") never connects, and says nothing
# more useful at run than "cannot be opened" once a second.
STREAM_SCHEMES = ("rtsp", "rtsps", "http", "https", "udp", "tcp", "rtmp")
# udp and tcp may listen: a host is optional there (udp://@:5000), a port is not
LISTENING = ("udp", "tcp")
# OpenCV reads a device index of 100 and more, with backend "any", as a backend's id plus
# an index (200: V4L2's device 0), its older spelling: such an index is not checked.
INDEX_OFFSETS = 100


def check(args: argparse.Namespace, cfg: Config) -> int:
    """Exit 2 with one line per problem (the source named as load errors are), else print
    the resolved config and exit 0."""
    from robotd.config import runtime_dir
    from robotd.runtime.rundir import RunDirError, check_run_dir

    try:
        check_run_dir(runtime_dir(cfg))
    except RunDirError as exc:
        given = any(o.partition("=")[0].strip() == "runtime.dir" for o in args.overrides)
        source = "--set runtime.dir" if given else f"{args.config}: runtime.dir"
        print(f"robotd: {source}: {str(exc).removeprefix('runtime.dir ')}", file=sys.stderr)
        return 2
    problems = camera_problems(Path(args.config), args.overrides, cfg)
    for line in problems:
        print(f"robotd: {line}", file=sys.stderr)
    if problems:
        return 2
    print(json.dumps(cfg.model_dump(mode="json"), indent=2))
    return 0


def camera_problems(config: Path, overrides: list[str], cfg: Config) -> list[str]:
    """Each camera whose source can never deliver: what its driver's `preflight` says (a
    classmethod: opencv's checks files and /dev paths), and for OpenCV a device index with
    no /dev/videoN and a malformed stream URL (`source_problem`). Lines of
    `SOURCE: cameras.NAME.options.KEY: ...`, SOURCE the file or the --set that gave the
    camera's options."""
    from drivers.base import driver_class, validate_options
    from drivers.opencv.camera import OpenCVOptions

    config_dir = config.resolve().parent
    given = [o.partition("=")[0].strip() for o in overrides]
    problems = []
    for name, cam in cfg.cameras.items():
        cls = driver_class("cameras", cam.driver)
        preflight = getattr(cls, "preflight", None)
        if preflight is None:
            continue
        options = validate_options(cls, cam.options)
        problem = preflight(options, config_dir)
        if problem is None and isinstance(options, OpenCVOptions):
            problem = source_problem(options, config_dir)
        if problem is None:
            continue
        field, _, why = problem.partition(":")
        key = f"cameras.{name}.options.{field}"
        by_set = any(key == g or key.startswith(g + ".") for g in given)
        problems.append(f"{'--set ' if by_set else f'{config}: '}{key}:{why}")
    return problems


def source_problem(
    options: OpenCVOptions, config_dir: Path, devices: Path = Path("/dev")
) -> str | None:
    """What the driver's preflight leaves: a device index (Linux: /dev/videoN under
    `devices`) naming no device, without a usable fallback (as for a missing /dev path);
    a stream URL that is malformed or of a scheme OpenCV does not open (whatever the
    fallback: a typo, not an absent camera). Not connected to. None when fine, else
    "source: SOURCE: why"."""
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
    from drivers.opencv.camera import unless_fallback

    problem = f"source: {source}: no such device ({device})"
    return unless_fallback(problem, options, config_dir)


def _url_problem(source: str, backend: str) -> str | None:
    from drivers.opencv.source import probe

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

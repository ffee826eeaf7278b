"""A test or bench's openpi server: openpi_peer_server.py in the peer venv, on a port of
its own, ready when GET /healthz answers 200 (what openpi's server answers when up)."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

from peer_venv import HERE

READY_S = 60.0  # a loaded 2-core machine starting a python with numpy and websockets


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PeerServer:
    """One openpi_peer_server.py process on a fixed port (kept across restarts)."""

    def __init__(self, python: Path, log_dir: Path, **opts: Any) -> None:
        self.python = python
        self.log = log_dir / f"openpi-server-{id(self)}.log"
        self.opts = opts
        self.port = opts.pop("port", None) or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'wss' if self.opts.get('tls') else 'ws'}://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [str(self.python), str(HERE / "openpi_peer_server.py"), "--port", str(self.port)]
        cmd += ["--policy", self.opts.get("policy", "test")]
        cmd += ["--metadata", json.dumps(self.opts.get("metadata", {}))]
        if self.opts.get("tls"):
            cmd += ["--tls", *map(str, self.opts["tls"])]
        if self.opts.get("api_key"):
            cmd += ["--api-key", self.opts["api_key"]]
        if self.opts.get("record"):
            cmd += ["--record", str(self.opts["record"])]
        if self.opts.get("first_delay"):  # the first inference's JIT compile, in seconds
            cmd += ["--first-delay", str(self.opts["first_delay"])]
        return cmd

    def start(self, wait: bool = True) -> PeerServer:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        """Poll GET /healthz until 200 (what openpi's server answers when up)."""
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"openpi server exited: {self.log.read_text()[-2000:]}")
            if self.healthz() == 200:
                return
            time.sleep(0.05)  # polling a condition with a deadline, not synchronising
        raise RuntimeError(f"openpi server not ready in {READY_S} s: {self.log.read_text()}")

    def healthz(self) -> int | None:
        ctx = None
        if self.opts.get("tls"):
            ctx = ssl.create_default_context(cafile=str(self.opts["ca"]))
        cls = http.client.HTTPSConnection if ctx else http.client.HTTPConnection
        kwargs = {"context": ctx} if ctx else {}
        conn = cls("127.0.0.1", self.port, timeout=2, **kwargs)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()

    def kill(self) -> None:
        """SIGKILL: the server vanishes without closing anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

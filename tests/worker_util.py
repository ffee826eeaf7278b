"""`robotd serve` of a test policy as a process of its own at a fixed endpoint, so that a
test can kill it and start it again (or another policy) where the daemon looks for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.copy_util import ROOT, TESTS, Client, wait_for


class Worker:
    """`robotd serve tests/fault_policies:Recorder` at a fixed endpoint (so that it can be
    killed and started again where the daemon looks for it), two copies, hang_s 1."""

    def __init__(
        self, root: Path, policy: str = "fault_policies:Recorder", scheme: str = "stream+ipc"
    ) -> None:
        self.root = root
        # stream+ipc: the transport the daemon's own local worker listens on; ipc: ZeroMQ
        self.endpoint = f"{scheme}://{root}/w.sock"
        self.acts_path = root / "acts.jsonl"
        self.policy = policy
        self.proc: subprocess.Popen[str] | None = None
        self.start()

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
        argv = [sys.executable, "-m", "robotd", "serve", self.policy, "--bind", self.endpoint]
        argv += ["--copies", "2", "--hang-s", "1", "--copy-memory-mib", "700"]
        argv += ["--arg", f'path="{self.acts_path}"']
        if self.policy.endswith("Recorder"):
            argv += ["--arg", f'flags="{self.root}"']
        self.log = (self.root / "worker.log").open("a")
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        client = Client(self.endpoint)
        try:
            wait_for(lambda: self._ready(client), "the worker's copies to be ready")
        finally:
            client.close()

    @staticmethod
    def _ready(client: Client) -> bool:
        try:
            pool = client.ping(timeout=2)["pool"]
        except AssertionError:
            return False
        return pool["ready"] >= 2 and pool["starting"] == 0

    def copy_holding(self, episode: str) -> int:
        client = Client(self.endpoint)
        try:
            copies = client.ping()["copies"]
        finally:
            client.close()
        (pid,) = [c["pid"] for c in copies if c["episode"] == episode]
        return pid

    def flag(self, fault: str) -> None:
        (self.root / fault).write_text("once")

    def acts(self) -> list[dict[str, Any]]:
        if not self.acts_path.exists():
            return []
        return [json.loads(line) for line in self.acts_path.read_text().splitlines() if line]

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

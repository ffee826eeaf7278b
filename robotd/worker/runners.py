"""How a copy of the policy runs: a child process (isolated: a crash, an out-of-memory kill
or a hang cannot take the worker with it), a thread of the worker (`--copies 0`: no
isolation, for debugging and tests that look into the policy in process), or the worker's
poll loop itself (`--inline`: the shortest round trip, nothing watched).

Both talk to the worker over a channel of their own (robotd.worker.channel: a Unix socket
pair; the runner keeps the worker's end as `channel`) and run
robotd.worker.child.serve_copy on the other end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from robotd.runtime.procutil import PARENT_ENV
from robotd.worker import channel, pipe
from robotd.worker.channel import Channel
from robotd.worker.child import build_host, error_done, job, memory_text, serve_copy
from robotd.worker.death import Memory, read_memory
from robotd.worker.policy_host import PolicyHost


class Runner(Protocol):
    """One copy's process or thread."""

    pid: int | None  # the process id (the worker's own for a thread)
    channel: Channel  # the worker's end of the copy's channel

    def start(self) -> None:
        """Start it; it connects and says `boot` (a process) or `ready` (a thread)."""

    def init_frames(self) -> list[pipe.Buffer] | None:
        """The `init` message to answer its `boot` with (None: a thread needs none)."""

    def fileno(self) -> int | None:
        """A descriptor readable once it has ended (a pidfd), or None: poll `exited`."""

    def exited(self) -> int | None:
        """Its exit status once it has ended (as Popen.returncode: -N for signal N)."""

    def kill(self) -> None:
        """End it now (SIGKILL); a thread cannot be killed and is left behind."""

    def terminate(self) -> None:
        """Ask it to end (SIGTERM); `exited` tells when it has."""

    def memory(self) -> Memory:
        """Its memory as last sampled by `sample`."""

    def sample(self) -> None:
        """Read its memory use now (cheap: /proc)."""

    def close(self) -> None:
        """Release what it holds once it has ended (reap the process, close the pidfd)."""


class ProcessRunner:
    """A copy in its own process: `python -m robotd.worker.child FD IDENTITY`, FD its end of
    the channel (inherited; no other descriptor is)."""

    def __init__(
        self,
        identity: bytes,
        spec: str,
        kwargs: Mapping[str, Any],
        memory_bytes: int = 0,
    ) -> None:
        self.identity = identity
        self.spec = spec
        self.kwargs = dict(kwargs)
        self.memory_bytes = memory_bytes
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pidfd: int | None = None
        self._memory = Memory()

    def start(self) -> None:
        ours, theirs = channel.pair()
        self.channel = channel.Channel(ours)
        argv = [sys.executable, "-m", "robotd.worker.child", str(theirs.fileno())]
        argv += [self.identity.decode(), "--memory-bytes", str(self.memory_bytes)]
        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        try:
            self._proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),)
            )
        finally:
            theirs.close()  # the copy holds it now: its end shows as the channel's end
        self.pid = self._proc.pid
        with contextlib.suppress(AttributeError, OSError):
            self._pidfd = os.pidfd_open(self.pid)

    def init_frames(self) -> list[pipe.Buffer] | None:
        return pipe.pack(
            {"k": "init", "spec": self.spec, "kwargs": self.kwargs, "path": list(sys.path)}
        )

    def fileno(self) -> int | None:
        return self._pidfd

    def exited(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, signum: int) -> None:
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signum)

    def memory(self) -> Memory:
        return self._memory

    def sample(self) -> None:
        if self.pid is not None and self.exited() is None:
            read_memory(self.pid, self._memory)

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        if hasattr(self, "channel"):
            self.channel.close()


class ThreadRunner:
    """A copy in a thread of the worker, on a channel within the process."""

    def __init__(self, identity: bytes, spec: str, kwargs: Mapping) -> None:
        self.identity = identity
        self.pid: int | None = os.getpid()
        ours, self._theirs = channel.pair()
        self.channel = channel.Channel(ours)
        self._spec, self._kwargs = spec, dict(kwargs)
        self._code: int | None = None
        self._thread = threading.Thread(target=self._run, name="robotd-copy", daemon=True)

    def _run(self) -> None:
        end = channel.CopyEnd(self._theirs)
        try:
            self._code = serve_copy(end, self._spec, self._kwargs)
        except (channel.ChannelClosed, OSError):
            self._code = 0  # the worker closed its end: it is stopping
        except BaseException:
            self._code = 1
            raise
        finally:
            end.close()

    def start(self) -> None:
        self._thread.start()

    def init_frames(self) -> list[pipe.Buffer] | None:
        return None

    def fileno(self) -> int | None:
        return None

    def exited(self) -> int | None:
        if self._thread.is_alive() or self._thread.ident is None:
            return None
        return self._code if self._code is not None else 1

    def kill(self) -> None:
        pass  # a thread cannot be killed: a hung one is left behind (a daemon thread)

    def terminate(self) -> None:
        pass  # the pool sends it `stop`

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def memory(self) -> Memory:
        return Memory()

    def sample(self) -> None:
        pass

    def close(self) -> None:
        if not self._thread.is_alive():
            self.channel.close()


class InlineRunner:
    """The copy in the worker's poll loop itself (`--inline`): the policy is built in
    `start` and each job is a plain call (`call`), as openpi's server runs its policy: no
    process hop, no thread hop, nothing copied (the observation arrays are read-only views
    of the request, as openpi's server hands them: copy one to write into it). The price:
    nothing isolates the worker from the policy, and while it computes the loop answers
    nothing (pings and uploads wait, and a hang is the worker's hang: only the daemon's act
    timeout sees it). Its channel carries only what the copy says at start (`ready` or
    `failed`), so the pool learns of it as of any copy."""

    def __init__(self, identity: bytes, spec: str, kwargs: Mapping) -> None:
        self.identity = identity
        self.pid: int | None = os.getpid()
        ours, theirs = channel.pair()
        self.channel = channel.Channel(ours)
        self._end = channel.CopyEnd(theirs)
        self._spec, self._kwargs = spec, dict(kwargs)
        self._host: PolicyHost | None = None
        self._code: int | None = None

    def start(self) -> None:
        built = build_host(self._end, self._spec, self._kwargs)
        if isinstance(built, PolicyHost):
            self._host = built
        else:
            self._code = built

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        """One `act` or `end` job (robotd.worker.child's messages), answered: its `done`."""
        seq = msg.get("seq")
        if self._host is None:
            return error_done(seq, "internal", "the policy was not built")
        try:
            done = job(self._host, msg)
        except MemoryError as err:  # the worker's own memory: answered, and it goes on
            return error_done(seq, "internal", memory_text(err))
        except SystemExit as err:  # a policy that calls exit() must not end the worker
            return error_done(seq, "policy_error", f"the policy called exit({err.code!r})")
        return done  # (its rows are check_actions' copy: the policy's buffer may change)

    def init_frames(self) -> list[pipe.Buffer] | None:
        return None

    def fileno(self) -> int | None:
        return None

    def exited(self) -> int | None:
        return self._code

    def kill(self) -> None:
        self._code = -9 if self._code is None else self._code

    def terminate(self) -> None:
        if self._code is None:
            self._code = 0  # as a copy told `stop`: no policy code runs any more

    def memory(self) -> Memory:
        return Memory()

    def sample(self) -> None:
        pass

    def close(self) -> None:
        self.channel.close()
        self._end.close()

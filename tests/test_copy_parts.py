"""The pieces under the copies, alone: declared parameters, the policy's Episode, the
main<->copy codec, and telling why a copy stopped."""

from __future__ import annotations

import os
import signal
from typing import Literal

import numpy as np
import pytest

from robotd import wire
from robotd.worker import pipe
from robotd.worker.death import Memory, describe_exit, kernel_log_oom, oom_record_names
from robotd.worker.episode import Episode
from robotd.worker.params import ParamError, check_params, declared_params, param_from_wire
from robotd.worker.policy_host import PolicyHost


class Tunable:
    def __init__(self) -> None:
        self.seen: list[tuple] = []
        self.resets: list[str] = []

    def reset(self, *, episode: Episode) -> None:
        self.resets.append(episode.id)
        episode.state["from_reset"] = True

    def infer(
        self,
        inputs: dict,
        *,
        episode: Episode,
        gain: float = 1.0,
        steps: int = 4,
        mode: Literal["a", "b"] = "a",
        note: str | None = None,
        untyped=0.5,
        weird: complex = 1j,
    ) -> list[list[float]]:
        self.seen.append((episode.id, episode.steps, dict(episode.state), gain, steps, mode))
        episode.state["n"] = episode.state.get("n", 0) + 1
        return [[gain]]


def test_infer_keywords_with_defaults_are_the_params() -> None:
    declared, warnings = declared_params(Tunable().infer)
    assert list(declared) == ["gain", "steps", "mode", "note", "untyped"]
    assert (declared["gain"].type, declared["gain"].default) == ("float", 1.0)
    assert declared["mode"].choices == ("a", "b") and declared["mode"].type == "str"
    assert declared["note"].nullable and declared["untyped"].type == "float"
    assert warnings == [
        "infer's keyword 'weird' is not settable: its type is not bool, int, "
        "float or str (annotate it)"
    ]
    wired = [p.to_wire(p.default) for p in declared.values()]
    assert [param_from_wire(w) for w in wire.unpackb(wire.packb(wired))] == list(declared.values())
    assert check_params(declared, {"gain": 2, "note": None, "mode": "b"}) == {
        "gain": 2.0,
        "note": None,
        "mode": "b",
    }
    with pytest.raises(ParamError, match=r"field 'set\.steps': 2\.5 \(float\) is not of type int"):
        check_params(declared, {"steps": 2.5})
    with pytest.raises(ParamError, match=r"unknown parameter \(known: gain, mode, note, steps"):
        check_params(declared, {"weird": 1})

    def plain(obs, needed: int, /, flag: bool = False, *rest, episode=None, **more):
        return obs

    assert list(declared_params(plain)[0]) == ["flag"]  # no inputs, episode, *args or required


def test_host_hands_infer_an_episode_and_params_fixed_at_its_start() -> None:
    host = PolicyHost.wrap(Tunable())
    policy = host.policy
    host.next_params = {"gain": 2.0}
    host.begin("E1")
    host.infer({}, "E1")
    host.next_params = {"gain": 3.0, "mode": "b"}  # set mid-episode: not for E1
    host.infer({}, "E1")
    host.end_episode("E1")
    host.begin("E2")
    host.infer({}, "E2")
    assert policy.resets == ["E1", "E2"]
    assert policy.seen == [
        ("E1", 0, {"from_reset": True}, 2.0, 4, "a"),
        ("E1", 1, {"from_reset": True, "n": 1}, 2.0, 4, "a"),
        ("E2", 0, {"from_reset": True}, 3.0, 4, "b"),
    ]
    assert host.current == "E2" and isinstance(host.episode, Episode)


def test_an_episode_is_also_its_id_string() -> None:
    ep = Episode("E7", {"gain": 1.0})
    assert ep == "E7" and {"E7": 1}[ep] == 1 and f"{ep}" == "E7" and ep.id == "E7"
    assert type(ep.id) is str and ep.steps == 0 and ep.state == {}
    with pytest.raises(TypeError):
        ep.params["gain"] = 2.0  # read-only


def test_pipe_carries_large_arrays_out_of_band_and_refuses_bad_frames() -> None:
    frame = np.arange(224 * 224 * 3, dtype=np.uint8).reshape(224, 224, 3)
    strided = np.ones((3, 64, 64), np.float32)[:, ::2]
    msg = {"obs": [{"top": frame, "small": np.arange(3.0), "chw": strided}], "n": 1}
    frames = pipe.pack(msg)
    assert len(frames) == 3 and len(frames[1]) == frame.nbytes  # raw bytes, no header
    got = pipe.unpack([bytes(f) for f in frames])
    np.testing.assert_array_equal(got["obs"][0]["top"], frame)
    np.testing.assert_array_equal(got["obs"][0]["chw"], strided)
    assert not got["obs"][0]["top"].flags.writeable
    for bad in ([frames[0]], [frames[0], frames[1][:-1], frames[2]], []):
        with pytest.raises(wire.WireError):
            pipe.unpack(bad)
    with pytest.raises(wire.WireError, match="cannot pack"):
        pipe.pack({"x": object()})


def test_why_a_copy_stopped_in_words() -> None:
    mem = Memory(rss=100 << 20, peak=300 << 20)
    assert describe_exit(3, 1, mem, None, 99).message.startswith("exited with code 3; last RSS")
    oom = describe_exit(99, 1, mem, None, 99)
    assert oom.kind == "out_of_memory" and "MemoryError" in oom.message
    segv = describe_exit(-signal.SIGSEGV, 1, mem, None, 99)
    assert segv.kind == "crashed" and segv.signal == "SIGSEGV"
    killed = describe_exit(-signal.SIGKILL, 2**22 + 17, mem, None, 99)  # no such pid on record
    assert killed.kind == "killed" and "killed by SIGKILL (out of memory?" in killed.message
    assert "last RSS 100 MiB (peak 300 MiB)" in killed.message


@pytest.mark.parametrize(
    ("record", "pid", "found"),
    [
        ("3,1234,5,-;Out of memory: Killed process 4242 (python) total-vm:1kB", 4242, True),
        ("3,1,5,-;Memory cgroup out of memory: Killed process 77 (python3)", 77, True),
        ("6,9,1,-;oom-kill:constraint=CONSTRAINT_MEMCG,task=python,pid=4242,uid=0", 4242, True),
        ("3,1234,5,-;Out of memory: Killed process 42420 (python)", 4242, False),
        ("6,9,1,-;usb 1-1: new device pid=4242", 4242, False),
    ],
)
def test_kernel_oom_records_name_the_pid(record: str, pid: int, found: bool) -> None:
    assert oom_record_names(record, pid) is found


def test_an_unreadable_kernel_log_is_unknown_not_absent(tmp_path) -> None:
    assert kernel_log_oom(os.getpid(), str(tmp_path / "no-kmsg")) is None

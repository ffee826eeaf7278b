"""policy.link / policy.worker / [policy.openpi] in robotd.config: validated at load, errors
naming the key; the example configs load and drive a sim robot through a real openpi
server (the daemon's wiring aside: the same pieces, called here in a loop)."""

from __future__ import annotations

import copy
import json
import subprocess
import time
from typing import Any

import anyio
import numpy as np
import pytest
from peer_venv import REPO

from drivers.base import CameraSpec
from drivers.sim.arm import SimArm
from drivers.sim.camera import SimCamera
from drivers.sim.world import SimWorld
from robotd.config import Config, config_from_dict, load_config
from robotd.errors import ConfigError
from robotd.link.openpi.client import OpenpiLink
from robotd.link.openpi.request import build_request, parse_reply

EXAMPLES = ["droid", "aloha", "libero"]


def _example(name: str) -> Config:
    return load_config(REPO / "config" / f"openpi-{name}.toml")


def _raw(name: str = "droid") -> dict[str, Any]:
    import tomllib

    return tomllib.loads((REPO / "config" / f"openpi-{name}.toml").read_text())


def test_default_is_the_native_link() -> None:
    cfg = load_config()
    assert cfg.policy.link == "robotd" and cfg.policy.openpi.inputs == []


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_load_and_check(name: str) -> None:
    cfg = _example(name)
    assert cfg.policy.link == "openpi" and cfg.policy.worker.startswith("ws://")
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "robotd"), "check", "--config", f"config/openpi-{name}.toml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def _error(raw: dict[str, Any], *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw, where="x.toml", overrides=overrides)
    return str(err.value)


def _with(change: Any) -> dict[str, Any]:
    raw = copy.deepcopy(_raw())
    change(raw["policy"]["openpi"])
    return raw


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda o: o["inputs"][0].update(source="nope"), r"inputs\[0\]\.source: 'nope' is not"),
        (lambda o: o["inputs"][2].update(joints="0:9"), r"inputs\[2\]\.joints: index 8 is past"),
        (lambda o: o["inputs"][2].update(joints="7:2"), r"inputs\[2\]\.joints.*start:stop"),
        (lambda o: o["inputs"][2].update(joints=[-1]), r"inputs\[2\]\.joints"),
        (lambda o: o["inputs"][0].update(bogus=1), r"inputs\[0\]\.bogus: unknown key"),
        (lambda o: o["inputs"][0].update(joints=[0]), r"inputs\[0\]\.joints: only for"),
        (lambda o: o["inputs"][2].update(image={}), r"image: only for camera"),
        (lambda o: o["inputs"][0].update(default="x"), r"default: only for source 'task'"),
        (lambda o: o["inputs"][4].update(window="stack"), r"the task text has no window"),
        (lambda o: o["inputs"][0]["image"].update(codec="jpeg", layout="chw"), r"needs codec"),
        (lambda o: o["inputs"][0]["image"].update(width=0), r"image\.width: must be > 0"),
        (lambda o: o["inputs"][1].update(key="prompt"), r"inputs\[4\]\.key: \['prompt'\] clash"),
        (lambda o: o["inputs"][1].update(key=[]), r"inputs\[1\]\.key"),
        (lambda o: o["actions"].update(columns="0:3"), r"actions\.columns: selects 3 columns"),
        (lambda o: o.update(api_key="k", api_key_env="E"), r"give one or the other"),
        (lambda o: o.update(backoff_initial_s=9.0), r"backoff_max_s 5.0 is below"),
        (lambda o: o.update(healthz="healthz"), r"healthz: 'healthz' must be a path"),
        (lambda o: o.update(inputs=[]), r"policy\.openpi\.inputs: map at least one"),
        (lambda o: o.update(connect_timeout_s=0), r"connect_timeout_s: must be > 0"),
        (lambda o: o.update(warmup_s=-1), r"policy\.openpi\.warmup_s: must be >= 0"),
        (lambda o: o.update(warmup_s=601), r"policy\.openpi\.warmup_s: must be <= 600"),
        (lambda o: o.update(warmup_s="long"), r"policy\.openpi\.warmup_s: must be a number"),
    ],
)
def test_errors_name_the_key(change: Any, message: str) -> None:
    import re

    text = _error(_with(change))
    assert text.startswith("x.toml: ") and "policy.openpi" in text
    assert re.search(message, text), text


def test_worker_and_streams_are_checked() -> None:
    assert "policy.worker: the openpi link needs a ws://" in _error(
        _raw(), 'policy.worker="tcp://gpu:5555"'
    )
    assert "policy.worker" in _error(_raw(), 'policy.worker=""')
    raw = _raw()
    raw["policy"]["observations"] = {"streams": {"exterior": {"at": [-1, 0]}}}
    assert "inputs[1].source: 'wrist' is not read by policy.observations" in _error(raw)
    sim = load_config().model_dump(mode="json")
    assert "policy.worker" in _error(sim, 'policy.link="openpi"')
    assert "policy.link: must be one of" in _error(sim, 'policy.link="grpc"')


def test_api_key_is_not_shown() -> None:
    raw = _with(lambda o: o.update(api_key="super-secret"))
    cfg = config_from_dict(raw)
    assert cfg.policy.openpi.api_key_value({}) == "super-secret"
    assert "super-secret" not in json.dumps(cfg.model_dump(mode="json"))
    assert "super-secret" not in repr(cfg)


@pytest.mark.parametrize("name", EXAMPLES)
def test_sim_robot_driven_through_openpi(name: str, openpi_server: Any) -> None:
    """The example config's sim robot and cameras, its mapping, the real openpi server:
    read joints, render frames, build the request, act, map the answer, write the joints."""
    cfg = _example(name)
    server = openpi_server(metadata={"env": name})
    names = cfg.joints.names
    world = SimWorld.local(len(names), time.monotonic_ns())
    arm = SimArm(names, SimArm.Options.model_validate(cfg.joints.options), world=world)
    cams = {
        c: SimCamera(
            CameraSpec(c, spec.width, spec.height, spec.fps),
            SimCamera.Options.model_validate(spec.options),
            world=world,
        )
        for c, spec in cfg.cameras.items()
    }
    arm.open()
    arm.torque(True)
    for cam in cams.values():
        cam.open()
    opts = cfg.policy.openpi
    cols = opts.actions.column_indices() or tuple(range(len(names)))
    width = max(cols) + 1

    async def main() -> None:
        link = OpenpiLink(server.url, opts.model_copy(update={"backoff_initial_s": 0.05}))
        assert await link.connect(deadline_s=30) == {"env": name}
        for act in range(3):
            state = arm.read()
            obs: dict[str, Any] = {
                c: cam.render_now(time.monotonic_ns()) for c, cam in cams.items()
            }
            obs["joints.pos"] = state.position
            request = build_request(opts, {"observations": [obs], "steps": [act]}, "sim task")
            target = np.full((4, width), 0.1 * (act + 1), dtype=np.float32)
            request["want_actions"] = target
            answer = parse_reply(opts.actions, await link.act(request, 10), len(names))
            assert answer.rows.shape == (4, len(names))
            assert np.allclose(answer.rows, target[:, list(cols)])
            arm.write(answer.rows[0])
        await link.close()

    try:
        anyio.run(main)
    finally:
        for cam in cams.values():
            cam.close()
        arm.close()

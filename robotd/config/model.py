"""A robot's whole config: its sections (robotd.config.sections, robotd.config.policy) and
the rules that span them, checked at load."""

from __future__ import annotations

import math
import os
from collections.abc import Callable

from pydantic import model_validator

from robotd.config.fields import ConfigModel
from robotd.config.policy import HANG_MIN_S, PolicyConfig
from robotd.config.problems import Problem, led, raise_any
from robotd.config.sections import (
    MAX_AGE_MS,
    CameraConfig,
    ControlConfig,
    JointsConfig,
    RobotConfig,
    RuntimeConfig,
    SafetyConfig,
)
from robotd.trace.options import TraceOptions

# policy.hang_s unset: at most this share of the robot's patience (max_hold_steps / hz),
# since the watchdog's count of holds goes on across an episode reset: the hang must be
# found, and the new copy's first chunk arrive, before the robot's patience runs out.
HANG_SHARE_OF_PATIENCE = 0.5


# cameras.NAME.max_age_ms unset where its default is shorter than the camera's frame period
# (under 5 fps): fitted to this many periods, leaving a frame that comes late time to count.
MAX_AGE_FIT_PERIODS = 2

# A camera's frame ring (shared memory, reserved up front) may take at most this share of
# the machine's memory (what /dev/shm holds by default).
RING_MEMORY_SHARE = 0.5


def _physical_memory() -> int:
    """This machine's memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def _ms(value: float) -> str:
    """Milliseconds as a message shows them: 200, 333.3, 20000."""
    return f"{value:.1f}".removesuffix(".0")


class Config(ConfigModel):
    robot: RobotConfig = RobotConfig()
    control: ControlConfig = ControlConfig()
    joints: JointsConfig
    safety: SafetyConfig = SafetyConfig()
    cameras: dict[str, CameraConfig] = {}
    policy: PolicyConfig = PolicyConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    trace: TraceOptions = TraceOptions()

    @model_validator(mode="after")
    def _cross(self) -> Config:
        """The rules that span sections, every broken one reported (Problems)."""
        problems: list[Problem] = [*self._check_merge(), *self._check_safety()]
        problems += self._raised(self._check_contract)
        problems += self._check_patience()
        if self.policy.link == "openpi":
            problems += self._check_openpi()
        problems += self._check_camera_names()
        problems += self._check_rings()
        problems += self._check_frame_age()
        real = [f"cameras.{n}" for n, c in self.cameras.items() if c.driver != "sim"]
        real += ["joints.driver"] if self.joints.driver != "sim" else []
        if self.robot.start == "episode" and real:
            # named after robot.start: the --set that made the robot real, if one did
            text = "'episode' (start moving by itself) is allowed for simulated robots only"
            problems.append((("robot.start", *real), f"{text}; a real robot starts 'latched'"))
        raise_any(problems)
        return self

    @staticmethod
    def _raised(check: Callable[[], None]) -> list[Problem]:
        """A check that raises ValueError leading with the key it is about, as a Problem."""
        try:
            check()
        except ValueError as exc:
            return [((), str(exc))]
        return []

    def _check_openpi(self) -> list[Problem]:
        """Every rule of the openpi link broken, each about its key and policy.link (a
        --set that made the link openpi is to blame for what it brings into force)."""
        p = self.policy
        streams = (p.observations or {}).get("streams")
        found = p.openpi.problems(p.worker, list(self.cameras), len(self.joints.names), streams)
        return [led(text, "policy.link") for text in found]

    def _check_merge(self) -> list[Problem]:
        c = self.control
        if c.merge != "replace" and (c.timing == "sync" or not c.aligned):
            why = "sync timing" if c.timing == "sync" else "aligned = false"
            text = (
                f"{c.merge!r} blends chunks in realtime aligned timing only, not with {why}; "
                "use merge = 'replace'"
            )
            return [(("control.merge",), text)]
        return []

    def _check_safety(self) -> list[Problem]:
        n = len(self.joints.names)
        problems: list[Problem] = []
        for key in ("max_velocity", "max_acceleration"):
            vals = getattr(self.safety, key)
            if vals is not None and len(vals) != n:
                text = f"needs one value per joint ({n}), got {len(vals)}"
                problems.append(((f"safety.{key}",), text))
        return problems

    def _check_camera_names(self) -> list[Problem]:
        problems: list[Problem] = []
        for name in self.cameras:
            if not name or not name.replace("_", "").replace("-", "").isalnum():
                text = "a camera name must be alphanumeric (- and _ allowed)"
                problems.append(((), f"cameras.{name!r}: {text}"))
        clash = set(self.cameras) & {"joints.pos", "joints.vel"}
        if clash:
            text = f"names {sorted(clash)} clash with joint observation keys"
            problems.append((("cameras",), text))
        return problems

    def _check_rings(self) -> list[Problem]:
        """Each camera's shared-memory ring fits: at most MAX_SLOTS slots (fps ×
        ring_seconds frames), and at most RING_MEMORY_SHARE of this machine's memory."""
        from robotd.shm import MAX_SLOTS, ring_bytes, ring_slots

        memory = _physical_memory()
        problems: list[Problem] = []
        for name, cam in self.cameras.items():
            at = f"cameras.{name}"
            slots = ring_slots(cam.fps, cam.ring_seconds)
            if slots > MAX_SLOTS:
                text = (
                    f"{cam.ring_seconds:g} s at {at}.fps = {cam.fps:g} needs {slots} ring "
                    f"slots, at most {MAX_SLOTS} (fps × ring_seconds ≤ {MAX_SLOTS - 1}); "
                    "lower either"
                )
                problems.append(((f"{at}.ring_seconds", f"{at}.fps"), text))
                continue
            size = ring_bytes((cam.height, cam.width, 3), slots)
            if memory and size > RING_MEMORY_SHARE * memory:
                text = (
                    f"its shared-memory ring needs {size / 1e9:.3g} GB ({at}.width × height × "
                    f"3 = {cam.width} × {cam.height} × 3 bytes a frame, {slots} slots from fps "
                    f"× ring_seconds = {cam.fps:g} × {cam.ring_seconds:g}), more than "
                    f"{RING_MEMORY_SHARE:.0%} of this machine's memory ({memory / 1e9:.3g} GB); "
                    "lower the size, fps or ring_seconds"
                )
                keys = ("width", "height", "fps", "ring_seconds")
                problems.append(((at, *(f"{at}.{k}" for k in keys)), text))
        return problems

    def _check_frame_age(self) -> list[Problem]:
        """Each camera's max_age_ms is at least its frame period (1000 / fps ms): the newest
        frame is up to a period old just before the next one comes (older when it is late),
        so a shorter limit calls the observation invalid for that share of every period and
        the robot holds. Left unset, the default is fitted to MAX_AGE_FIT_PERIODS periods
        (at most MAX_AGE_MS)."""
        problems: list[Problem] = []
        fitted = {}
        for name, cam in self.cameras.items():
            period = 1e3 / cam.fps
            if cam.max_age_ms >= period:
                continue
            if "max_age_ms" not in cam.model_fields_set and period <= MAX_AGE_MS:
                age = min(MAX_AGE_MS, MAX_AGE_FIT_PERIODS * period)
                fitted[name] = cam.model_copy(update={"max_age_ms": age})
                continue
            at = f"cameras.{name}"
            share = max(1, round(100 * (1 - cam.max_age_ms / period)))
            text = (
                f"must be at least one frame period ({_ms(period)} ms at {at}.fps = "
                f"{cam.fps:g}), got {cam.max_age_ms:g}: the newest frame would be too old "
                f"{share} % of the time (the observation invalid, the robot holding); "
            )
            if period <= MAX_AGE_MS:
                text += (
                    f"make it {math.ceil(period)} ms or more ({MAX_AGE_FIT_PERIODS} periods, "
                    f"{math.ceil(MAX_AGE_FIT_PERIODS * period)} ms, leave a late frame time) "
                    f"or raise {at}.fps"
                )
            else:
                text += f"raise {at}.fps to {1e3 / MAX_AGE_MS:g} or more (max_age_ms is at "
                text += f"most {MAX_AGE_MS} ms)"
            problems.append(((f"{at}.max_age_ms", f"{at}.fps"), text))
        if fitted:
            # (frozen models: the whole table is replaced, as the validated value)
            cameras = {n: fitted.get(n, cam) for n, cam in self.cameras.items()}
            object.__setattr__(self, "cameras", cameras)
        return problems

    def _check_patience(self) -> list[Problem]:
        """A hung policy is found before the episode starves: the local worker's
        `policy.hang_s` must be shorter than `control.max_hold_steps / control.hz`. Left
        unset, hang_s's default (5 s) is capped at HANG_SHARE_OF_PATIENCE of the patience,
        never under HANG_MIN_S: with a patience shorter than that floor, a stall ends the
        episode 'starved' before a hung copy is found, which the robot survives holding
        (a copy killed as hung while it computes an ordinary act would not be).
        A remote worker or an openpi server has no hang_s of ours (the remote worker's own
        --hang-s is its business)."""
        p, c = self.policy, self.control
        if p.link != "robotd" or p.worker:
            return []
        patience = c.max_hold_steps / c.hz
        said = f"control.max_hold_steps / control.hz = {c.max_hold_steps} / {c.hz:g} Hz = "
        said += f"{patience:.3g} s"
        if p.hang_s < patience:
            return []
        if "hang_s" not in p.model_fields_set:
            # (frozen models: the whole section is replaced, as the validated value)
            hang = max(HANG_MIN_S, patience * HANG_SHARE_OF_PATIENCE)
            object.__setattr__(self, "policy", p.model_copy(update={"hang_s": hang}))
            return []
        text = (
            f"{p.hang_s:g} s is not shorter than the robot's patience, {said}: a hung policy "
            f"would end the episode 'starved' before it is found hung; make policy.hang_s "
            f"less than {patience:.3g} s (at most half leaves the new copy time to answer) or "
            "raise control.max_hold_steps"
        )
        return [(("policy.hang_s", "control.max_hold_steps", "control.hz"), text)]

    def _check_contract(self) -> None:
        """A contract declared here (for servers that cannot) is checked at load, not at run
        (ValueError leading with the key)."""
        from robotd.contract import Actions, ContractError, Observations

        p = self.policy
        try:
            if p.observations is not None:
                obs = Observations.from_wire(p.observations, "policy.observations")
                obs.resolve(self.control.hz)
                unknown = sorted(set(obs.streams) - set(self.observation_keys))
                if unknown:
                    raise ValueError(
                        f"policy.observations.streams: {unknown} are not observation keys of "
                        f"this robot {self.observation_keys}"
                    )
            if p.actions is not None:
                Actions.from_wire(p.actions, "policy.actions")
        except ContractError as exc:
            raise ValueError(str(exc)) from None

    @property
    def observation_keys(self) -> list[str]:
        """Every key a step's observation can hold: each camera, then the joint streams."""
        return [*self.cameras, "joints.pos", "joints.vel"]



"""A robot's whole config: its sections (robotd.config.sections) and the rules that span
them, checked at load."""

from __future__ import annotations

import os

from pydantic import model_validator

from robotd.config.sections import (
    CameraConfig,
    ControlConfig,
    JointsConfig,
    PolicyConfig,
    RobotConfig,
    RuntimeConfig,
    SafetyConfig,
    _Model,
)
from robotd.trace.options import TraceOptions

# policy.hang_s unset: at most this share of the robot's patience (max_hold_steps / hz),
# since the watchdog's count of holds goes on across an episode reset: the hang must be
# found, and the new copy's first chunk arrive, before the robot's patience runs out.
HANG_SHARE_OF_PATIENCE = 0.5


# A camera's frame ring (shared memory, reserved up front) may take at most this share of
# the machine's memory (what /dev/shm holds by default).
RING_MEMORY_SHARE = 0.5


def _physical_memory() -> int:
    """This machine's memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


class Config(_Model):
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
        c = self.control
        if c.merge != "replace" and (c.timing == "sync" or not c.aligned):
            why = "sync timing" if c.timing == "sync" else "aligned = false"
            raise ValueError(
                f"control.merge: {c.merge!r} blends chunks in realtime aligned timing only, "
                f"not with {why}; use merge = 'replace'"
            )
        n = len(self.joints.names)
        for key in ("max_velocity", "max_acceleration"):
            vals = getattr(self.safety, key)
            if vals is not None and len(vals) != n:
                raise ValueError(f"safety.{key}: needs one value per joint ({n}), got {len(vals)}")
            if vals is not None and any(v <= 0 for v in vals):
                raise ValueError(f"safety.{key}: every value must be > 0, got {vals}")
        self._check_contract()
        self._check_patience()
        if self.policy.link == "openpi":
            streams = (self.policy.observations or {}).get("streams")
            self.policy.openpi.check(self.policy.worker, list(self.cameras), n, streams)
        clash = set(self.cameras) & {"joints.pos", "joints.vel"}
        for name in self.cameras:
            if not name or not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(
                    f"cameras.{name!r}: a camera name must be alphanumeric (- and _ allowed)"
                )
        if clash:
            raise ValueError(f"cameras: names {sorted(clash)} clash with joint observation keys")
        self._check_rings()
        if self.robot.start == "episode" and (
            self.joints.driver != "sim" or any(c.driver != "sim" for c in self.cameras.values())
        ):
            raise ValueError(
                "robot.start: 'episode' (start moving by itself) is allowed for simulated "
                "robots only; a real robot starts 'latched'"
            )
        return self

    def _check_rings(self) -> None:
        """Each camera's shared-memory ring fits: at most MAX_SLOTS slots (fps ×
        ring_seconds frames), and at most RING_MEMORY_SHARE of this machine's memory."""
        from robotd.shm import MAX_SLOTS, ring_bytes, ring_slots

        memory = _physical_memory()
        for name, cam in self.cameras.items():
            at = f"cameras.{name}"
            slots = ring_slots(cam.fps, cam.ring_seconds)
            if slots > MAX_SLOTS:
                raise ValueError(
                    f"{at}.ring_seconds: {cam.ring_seconds:g} s at {at}.fps = {cam.fps:g} needs "
                    f"{slots} ring slots, at most {MAX_SLOTS} (fps × ring_seconds ≤ "
                    f"{MAX_SLOTS - 1}); lower either"
                )
            size = ring_bytes((cam.height, cam.width, 3), slots)
            if memory and size > RING_MEMORY_SHARE * memory:
                raise ValueError(
                    f"{at}: its shared-memory ring needs {size / 1e9:.3g} GB ({at}.width × "
                    f"height × 3 = {cam.width} × {cam.height} × 3 bytes a frame, {slots} slots "
                    f"from fps × ring_seconds = {cam.fps:g} × {cam.ring_seconds:g}), more than "
                    f"{RING_MEMORY_SHARE:.0%} of this machine's memory ({memory / 1e9:.3g} GB); "
                    "lower the size, fps or ring_seconds"
                )

    def _check_patience(self) -> None:
        """A hung policy is found before the episode starves: the local worker's
        `policy.hang_s` must be shorter than `control.max_hold_steps / control.hz`, else
        ValueError naming both. Left unset, its default (5 s) is capped at
        HANG_SHARE_OF_PATIENCE of the patience. A remote worker or an openpi server has
        no hang_s of ours (the remote worker's own --hang-s is its business)."""
        p, c = self.policy, self.control
        if p.link != "robotd" or p.worker:
            return
        patience = c.max_hold_steps / c.hz
        if p.hang_s < patience:
            return
        if "hang_s" not in p.model_fields_set:
            # (frozen models: the whole section is replaced, as the validated value)
            capped = p.model_copy(update={"hang_s": patience * HANG_SHARE_OF_PATIENCE})
            object.__setattr__(self, "policy", capped)
            return
        raise ValueError(
            f"policy.hang_s: {p.hang_s:g} s is not shorter than the robot's patience, "
            f"control.max_hold_steps / control.hz = {c.max_hold_steps} / {c.hz:g} Hz = "
            f"{patience:.3g} s: a hung policy would end the episode 'starved' before it is "
            f"found hung; make policy.hang_s less than {patience:.3g} s (at most half leaves "
            "the new copy time to answer) or raise control.max_hold_steps"
        )

    def _check_contract(self) -> None:
        """A contract declared here (for servers that cannot) is checked at load, not at run."""
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



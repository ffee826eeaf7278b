"""A simulated arm: a two-link planar arm (shoulder, elbow) plus grippers/extra axes.

Every joint follows its target with a first-order response (time constant
tau_s), its speed clipped to velocity_limit, its position clipped to physical
stops. The state is integrated lazily, from the last integration time to clock():
a virtual clock makes a run reproducible bit for bit.

When the state advances (and is published to the world, for the sim cameras):
  - read() and torque() always advance to clock(); :meth:`SimArm.sync` does so alone;
  - write() advances only when more than WRITE_ADVANCE_NS have passed since the last
    advance: the old target governs the motion up to the write, except for at most
    that much time, which the new target then governs (at the 4 rad/s default speed
    limit, under half a milliradian). In a control tick (read, then write tens of µs
    later) the write therefore never integrates or publishes a second time;
  - ground_truth() never advances: it reports the state of the last advance, with the
    dot where it was at that instant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pydantic

from drivers.base import DriverContext, DriverFault, DriverOptions, JointDriver, JointState
from drivers.sim import geometry as g
from drivers.sim.world import SimWorld, world_name

ARM_LOWER, ARM_UPPER = -2.8, 2.8
GRIPPER_LOWER, GRIPPER_UPPER = 0.0, 1.0
EFFORT_GAIN = 10.0  # effort per rad of tracking offset (a P-controller's output)
WRITE_ADVANCE_NS = 100_000  # write() integrates first only if the last advance is older


def _vector(
    names: tuple[str, ...], option: str, given: list[float] | None, default: list[float]
) -> np.ndarray:
    values = default if given is None else given
    if len(values) != len(names):
        raise ValueError(f"{option}: {len(values)} values for {len(names)} joints {list(names)}")
    array = np.array(values, dtype=np.float64)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{option}: values must be finite, got {values}")
    return array


class SimArm(JointDriver):
    """The simulated arm; see the module docstring for its dynamics.

    Joints 0 and 1 are the planar arm; any further joint is a gripper/extra axis
    with the same dynamics (default range 0..1). Torque starts off; enabling it
    sets the target to the present position, so that nothing jumps. Reads
    publish the true positions to the world (for the sim cameras). One thread.
    """

    class Options(DriverOptions):
        tau_s: float = pydantic.Field(0.05, gt=0)  # first-order response time constant
        velocity_limit: float = pydantic.Field(4.0, gt=0)  # rad/s per joint
        noise: float = pydantic.Field(0.0005, ge=0)  # std of position read noise
        seed: int = 0
        initial: list[float] | None = None  # default: tip on the dot's start, grippers 0
        lower: list[float] | None = None  # physical stops; default ±2.8 arm, 0 grippers
        upper: list[float] | None = None  # default 2.8 arm, 1 grippers

    def __init__(
        self,
        names: Sequence[str],
        options: SimArm.Options,
        context: DriverContext | None = None,
        *,
        world: SimWorld | None = None,
    ) -> None:
        """`world`: a world of the sim package's own making (the virtual rig); by default
        the arm creates the run's shared world under context.shm_prefix at open(), or a
        world in process memory when there is no prefix."""
        context = context or DriverContext()
        names = tuple(names)
        if len(names) < 2 or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"SimArm: names needs >= 2 non-empty joint names, got {names!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"SimArm: joint names must be unique, got {names!r}")
        if world is not None and world.n_joints != len(names):
            raise ValueError(f"SimArm: world has {world.n_joints} joints, names has {len(names)}")
        self.names = names
        self.options = options
        self._clock = context.clock
        self._prefix = context.shm_prefix
        self._world = world
        self._own_world = False
        try:
            self._lower, self._upper, self._q = self._vectors(names, options)
        except ValueError as exc:
            raise ValueError(f"SimArm option {exc}") from None
        self._target = self._q.copy()
        self._velocity = np.zeros(len(names))
        self._rng = np.random.default_rng(options.seed)
        self._torque = False
        self._open = False
        self._t_last: int | None = None

    @classmethod
    def check_options(cls, names: Sequence[str], options: DriverOptions) -> None:
        assert isinstance(options, SimArm.Options)
        if len(names) < 2:
            raise ValueError(f"names: the sim arm needs >= 2 joints, got {len(names)}")
        cls._vectors(tuple(names), options)

    @staticmethod
    def _vectors(
        names: tuple[str, ...], options: SimArm.Options
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lower, upper, initial), one value per joint each; ValueError "OPTION: why"."""
        extra = len(names) - 2  # grippers and further axes
        lower = _vector(names, "lower", options.lower, [ARM_LOWER] * 2 + [GRIPPER_LOWER] * extra)
        upper = _vector(names, "upper", options.upper, [ARM_UPPER] * 2 + [GRIPPER_UPPER] * extra)
        for i in np.flatnonzero(lower >= upper):
            raise ValueError(f"lower: joint {names[i]!r} has lower >= upper")
        default_initial = [*g.inverse(g.target_at(0.0)), *([0.0] * extra)]
        q = _vector(names, "initial", options.initial, default_initial)
        for i in np.flatnonzero((q < lower) | (q > upper)):
            raise ValueError(f"initial: joint {names[i]!r} is outside its stops")
        return lower, upper, q

    # ---- JointDriver --------------------------------------------------------------

    def open(self) -> None:
        """Start the simulation (torque off); the first open fixes t0 if there is no world."""
        now = self._clock()
        if self._world is None:
            n = len(self.names)
            if self._prefix is None:
                self._world = SimWorld.local(n, now)
            else:  # the sim cameras (processes of their own) attach to it by name
                self._world = SimWorld.create(world_name(self._prefix), n, now)
            self._own_world = True
        self._t_last = now
        self._open = True
        self._world.publish(self._q, now)

    def read(self) -> JointState:
        """Integrate to clock(), publish to the world, return the state with read noise."""
        self._check_open()
        now = self._clock()
        self._advance(now)
        position = self._q.copy()
        if self.options.noise > 0:
            position += self._rng.normal(0.0, self.options.noise, len(self.names))
        effort = EFFORT_GAIN * (self._target - self._q) if self._torque else np.zeros_like(self._q)
        return JointState(position, self._velocity.copy(), effort, now)

    def write(self, targets: np.ndarray) -> None:
        """Command one target per joint; DriverFault for a wrong shape or a non-finite value."""
        self._check_open()
        try:
            array = np.asarray(targets, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise DriverFault(f"SimArm.write: targets are not numbers: {exc}") from None
        if array.shape != (len(self.names),):
            raise DriverFault(
                f"SimArm.write: targets must have shape ({len(self.names)},), got {array.shape}"
            )
        bad = np.flatnonzero(~np.isfinite(array))
        if bad.size:
            joint = self.names[bad[0]]
            raise DriverFault(
                f"SimArm.write: target for joint {joint!r} is {array[bad[0]]}", joint=joint
            )
        now = self._clock()
        assert self._t_last is not None  # set by open()
        if now - self._t_last > WRITE_ADVANCE_NS:
            self._advance(now)  # the old target governs the motion up to now
        self._target = array.copy()

    def torque(self, on: bool) -> None:
        """Enable (holding the present position) or disable holding torque."""
        self._check_open()
        self._advance(self._clock())
        if on and not self._torque:
            self._target = self._q.copy()
        self._torque = bool(on)

    def close(self) -> None:
        """Stop the simulation; idempotent. A world the arm made is closed and unlinked;
        one it was given belongs to the caller."""
        self._open = False
        self._torque = False
        if self._own_world and self._world is not None:
            self._world.close()
            self._world.unlink()
            self._world = None
            self._own_world = False

    def sync(self) -> None:
        """Integrate to clock() and publish the pose to the world, as read() does, without
        reading (for a caller that renders the world at a chosen instant)."""
        self._check_open()
        self._advance(self._clock())

    def ground_truth(self) -> dict[str, float]:
        """Task metrics at the last advance (the last read, sync, torque change or open;
        this call does not integrate): the tip's distance to the dot, and both positions."""
        self._check_open()
        assert self._world is not None and self._t_last is not None  # set by open()
        _, tip = g.forward(self._q)
        target = g.target_at((self._t_last - self._world.t0_ns) / 1e9)
        return {
            "tracking_error": float(math.hypot(*(tip - target))),
            "tip_x": float(tip[0]),
            "tip_y": float(tip[1]),
            "target_x": float(target[0]),
            "target_y": float(target[1]),
        }

    # ---- dynamics -----------------------------------------------------------------

    def _advance(self, now: int) -> None:
        """Integrate the dynamics from the last integration time to `now` (ns)."""
        assert self._t_last is not None and self._world is not None
        dt = (now - self._t_last) / 1e9
        if dt <= 0:
            return
        self._t_last = now
        if self._torque:
            self._step(dt)
        else:
            self._velocity[:] = 0.0
        self._world.publish(self._q, now)

    def _step(self, dt: float) -> None:
        # Exact first-order step toward the target, then the speed limit over dt.
        decay = math.exp(-dt / self.options.tau_s)
        step = (self._target - self._q) * (1.0 - decay)
        max_step = self.options.velocity_limit * dt
        # two ufuncs each rather than np.clip, whose dispatch dominates on a few joints
        step = np.minimum(np.maximum(step, -max_step), max_step)
        q_new = np.minimum(np.maximum(self._q + step, self._lower), self._upper)
        self._velocity = (q_new - self._q) / dt
        self._q = q_new

    def _check_open(self) -> None:
        if not self._open:
            raise DriverFault(f"SimArm {list(self.names)} is not open")

"""A chain of serial servos as one JointDriver: what Dynamixel and Feetech share.

Per tick: `read()` is one sync read of a contiguous block (position, velocity, effort),
retried for the servos that failed within the tick's budget; `write()` is one sync write
of the goal positions (no reply). Ticks become SI through the arm's calibration; without a
calibration the driver refuses to open (and so to enable torque), saying how to make one.
A family (drivers.dynamixel, drivers.feetech) supplies its codec, its registers and what
it configures at open.
"""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np

from drivers.base import (
    DriverContext,
    DriverFault,
    DriverOptions,
    DriverStats,
    JointCounters,
    JointDriver,
    JointState,
)
from drivers.servo.bus import BusError, Codec, Reply, ServoBus
from drivers.servo.calibration import Calibration, Converter, resolve_path
from drivers.servo.homing import FAMILIES, model_name
from drivers.servo.options import ServoOptions, wrong_model
from drivers.servo.preflight import calibration_problems, port_problem, preflight
from drivers.servo.reader import StateReader
from drivers.servo.transport import SerialTransport, TransportError

OPEN_SLACK_S = 0.1  # the wait for each reply at open (see ServoJoints.open)


class ServoJoints(JointDriver):
    """Base of the serial servo drivers; see the module docstring."""

    Options: ClassVar[type[ServoOptions]] = ServoOptions
    protocol: ClassVar[str]
    software_direction: ClassVar[bool]  # drive mode applied here (True) or by the servo
    state_block: ClassVar[tuple[int, int]]
    goal_register: ClassVar[tuple[int, int]]  # address, bytes
    torque_register: ClassVar[int]
    velocity_unit: ClassVar[float]  # raw velocity → rad/s

    def __init__(self, names: Sequence[str], options: ServoOptions, context: DriverContext) -> None:
        self.names = tuple(names)
        self.check_options(self.names, options)
        self.options = options
        self.context = context
        self.ids = tuple(options.ids)
        self.calibration_path = resolve_path(options.calibration, context.config_dir)
        self._stats = DriverStats({n: JointCounters() for n in self.names})
        self._transport: SerialTransport | None = None
        self.bus: ServoBus | None = None
        self.converter: Converter | None = None
        self.calibration: Calibration | None = None
        self.models: dict[int, int] = {}
        self._reader: StateReader | None = None
        self._effort_units = np.ones(len(self.names))
        self._torque = False
        self._conditions: dict[int, str] = {}

    @classmethod
    def check_options(cls, names: Sequence[str], options: DriverOptions) -> None:
        assert isinstance(options, ServoOptions)
        if len(options.ids) != len(names):
            raise ValueError(
                f"ids: one servo ID per joint ({len(names)}: {list(names)}), "
                f"got {len(options.ids)}"
            )
        if options.models and len(options.models) != len(names):
            raise ValueError(
                f"models: one model per joint ({len(names)}: {list(names)}), or none (not "
                f"checked), got {len(options.models)}"
            )
        unknown = [g for g in options.grippers if g not in names]
        if unknown:
            raise ValueError(f"grippers: {unknown} are not joint names {list(names)}")

    @classmethod
    def preflight(
        cls, names: Sequence[str], options: DriverOptions, config_dir: Path | None
    ) -> list[str]:
        """What `robotd check` refuses before a restart, from files alone (nothing opened,
        nothing moved): drivers.servo.preflight. Lines of "KEY, KEY: why"."""
        assert isinstance(options, ServoOptions)
        path = resolve_path(options.calibration, config_dir)
        return preflight(cls.protocol, names, options.port, path, options.ids)

    # ---- family hooks ------------------------------------------------------------------

    @abstractmethod
    def codec(self) -> Codec: ...

    @abstractmethod
    def configure(self, bus: ServoBus, cal: Calibration) -> None:
        """At open, torque off: put each servo in the state robotd drives it in
        (operating mode, return delay, homing offset and direction from `cal`)."""

    @abstractmethod
    def decode_state(self, data: bytes) -> tuple[int, int, int]:
        """(position ticks, raw velocity, raw effort) from one servo's state block."""

    @abstractmethod
    def encode_goal(self, ticks: int) -> bytes: ...

    def effort_unit(self, ident: int) -> float:
        return 1.0

    def use_fast_read(self) -> bool:
        return False

    def condition(self, bus: ServoBus, reply: Reply) -> str:
        """A servo's reported condition (error byte set on data we keep) in words."""
        return bus.codec.describe_error(reply.error)

    def after_torque(self, bus: ServoBus, on: bool) -> None:
        """Family extras once torque is on, or off (`on` False: best effort, after every
        servo was told to let go)."""

    # ---- the contract ------------------------------------------------------------------

    def open(self) -> None:
        self.calibration = self._load_calibration()
        self.converter = Converter(
            self.calibration,
            self.names,
            self.options.grippers,
            software_direction=self.software_direction,
        )
        o = self.options
        absent = port_problem(o.port)  # the sentence `robotd check` says
        if absent is not None:
            raise DriverFault(f"{self.protocol}: {absent.why}")
        transport = SerialTransport(
            o.port, o.baud, warn=self.context.warn, low_latency=o.low_latency
        )
        try:
            transport.open()
        except TransportError as exc:
            raise DriverFault(f"{self.protocol}: {exc}") from None
        self._transport = transport
        # At open no tick waits: a reply may come late by a USB adapter's latency timer
        # (16 ms by default on FTDI) or a loaded machine, and refusing to start for that
        # helps no one. The ticks' reads then wait timeout_ms only.
        self.bus = ServoBus(
            self.codec(),
            transport,
            slack_s=max(o.timeout_ms / 1e3, OPEN_SLACK_S),
            return_delay_s=o.return_delay_us / 1e6,
        )
        try:
            self._ping_all()
            wrong = self._wrong_model()
            if wrong is not None:  # before configure: nothing is written to another arm
                self.close()
                raise wrong
            self.configure(self.bus, self.calibration)
            self.bus.slack_s = o.timeout_ms / 1e3
        except BusError as exc:
            self.close()
            raise self._bus_fault(f"{self.protocol} on {o.port}", exc) from None
        except TransportError as exc:
            self.close()
            raise DriverFault(f"{self.protocol}: {exc}") from None
        self._effort_units = np.array([self.effort_unit(i) for i in self.ids])
        self._reader = StateReader(
            self.bus,
            self.ids,
            self.names,
            [self._stats.joints[n] for n in self.names],
            self.state_block,
            retries=o.retries,
            budget_s=o.budget_ms / 1e3,
            fast=self.use_fast_read(),
        )

    def read(self) -> JointState:
        replies = self._read_replies()
        conv = self._converter()
        raw = np.array([self.decode_state(replies[i].data) for i in self.ids], dtype=np.float64)
        state = JointState(
            position=conv.to_si(raw[:, 0]),
            velocity=conv.velocity_to_si(raw[:, 1], self.velocity_unit),
            effort=raw[:, 2] * self._effort_units,
            read_time_ns=self.context.clock(),
        )
        self._check_conditions(replies)
        return state

    def write(self, targets: np.ndarray) -> None:
        ticks = self._converter().to_ticks(np.asarray(targets, dtype=np.float64))
        address, size = self.goal_register
        items = [(i, self.encode_goal(int(t))) for i, t in zip(self.ids, ticks)]
        try:
            self._bus().sync_write(address, size, items)
        except TransportError as exc:
            raise DriverFault(f"{self.protocol}: {exc}") from None

    def torque(self, on: bool) -> None:
        bus = self._bus()
        self._converter()
        try:
            if on:
                self._torque_on(bus)
            else:
                self._torque_off(bus)
        except BusError as exc:
            raise self._bus_fault(f"torque {'on' if on else 'off'}", exc) from None
        except TransportError as exc:
            raise DriverFault(f"{self.protocol}: {exc}") from None
        self._torque = on

    def _torque_on(self, bus: ServoBus) -> None:
        # hold where the joints are: goal = present before the torque comes on
        replies = self._read_replies()
        address, size = self.goal_register
        goals = [(i, self.encode_goal(self.decode_state(replies[i].data)[0])) for i in self.ids]
        bus.sync_write(address, size, goals)
        for i in self.ids:
            bus.write(i, self.torque_register, b"\x01")
        self.after_torque(bus, True)

    def _torque_off(self, bus: ServoBus) -> None:
        """Every servo that answers is let go, whichever ones do not (an e-stop with one
        servo gone still stops the rest); then BusError for the first that did not."""
        failed: list[BusError] = []
        for i in self.ids:
            try:
                bus.write(i, self.torque_register, b"\x00")
            except BusError as exc:
                failed.append(exc)
        with contextlib.suppress(BusError):
            self.after_torque(bus, False)  # its extras are not what stops the arm
        if failed:
            raise failed[0]

    def close(self) -> None:
        transport, self._transport = self._transport, None
        if transport is None:
            return
        if self._torque and self.bus is not None:
            for i in self.ids:
                with contextlib.suppress(BusError, TransportError):
                    self.bus.write(i, self.torque_register, b"\x00", tries=1)
            self._torque = False
        transport.close()

    def stats(self) -> DriverStats:
        return self._stats

    @property
    def echoes(self) -> int:
        return self._transport.echoes if self._transport is not None else 0

    # ---- pieces ------------------------------------------------------------------------

    def _load_calibration(self) -> Calibration:
        """The calibration, by `calibration_problems`' rules (`robotd check`'s): the
        first problem is a DriverFault naming it."""
        cal, problems = calibration_problems(
            self.calibration_path, self.protocol, self.names, self.ids
        )
        if problems:
            raise DriverFault(f"{self.protocol}: {problems[0].why}", joint=problems[0].joint)
        assert cal is not None
        return cal

    def _ping_all(self) -> None:
        bus = self._bus()
        for ident in self.ids:
            reply = bus.ping(ident)
            self.models[ident] = self.model_of(bus, ident, reply)

    def _wrong_model(self) -> DriverFault | None:
        """The first servo that answered as another model than joints.options.models says
        (another arm on this port, a servo swapped), as a fault naming its joint; None when
        every one matches, or no models are given."""
        o = self.options
        family = FAMILIES[self.protocol]
        got = {i: model_name(family, n) for i, n in self.models.items()}
        wrong = wrong_model(self.names, self.ids, o.models, got)
        if wrong is None:
            return None
        joint, words = wrong
        return DriverFault(
            f"{self.protocol} on {o.port}: {words} Nothing was written to it", joint=joint
        )

    def model_of(self, bus: ServoBus, ident: int, ping: Reply) -> int:
        """The model number of a servo that answered a ping."""
        return int.from_bytes(ping.data[:2], "little") if len(ping.data) >= 2 else 0

    def _read_replies(self) -> dict[int, Reply]:
        if self._reader is None:
            raise DriverFault(f"{self.protocol}: not open")
        try:
            return self._reader.read()
        except TransportError as exc:
            raise DriverFault(f"{self.protocol}: {exc}") from None

    def _check_conditions(self, replies: dict[int, Reply]) -> None:
        """A servo reporting a condition (alert, overload, voltage) fails the read: it may
        have let go of its joint. Each new condition is said once."""
        bad = []
        for ident in self.ids:
            r = replies[ident]
            if not r.error:
                self._conditions.pop(ident, None)
                continue
            text = self._conditions.get(ident)
            if text is None:
                try:
                    text = self.condition(self._bus(), r)
                except (BusError, TransportError) as exc:
                    text = f"{self._bus().codec.describe_error(r.error)} ({exc})"
                self._conditions[ident] = text
                self.context.warn(f"{self._joint(ident)} (servo {ident}): {text}")
            bad.append(f"{self._joint(ident)} (servo {ident}): {text}")
        if bad:
            raise DriverFault("servo error: " + "; ".join(bad), joint=bad[0].split(" ")[0])

    def _joint(self, ident: int) -> str | None:
        return dict(zip(self.ids, self.names)).get(ident)

    def _bus_fault(self, what: str, exc: BusError) -> DriverFault:
        """A failed transaction as a fault naming the joint as well as the servo's ID."""
        joint = self._joint(exc.ident)
        named = f"joint {joint!r}, " if joint is not None else ""
        return DriverFault(f"{what}: {named}{exc}", joint=joint)

    def _bus(self) -> ServoBus:
        if self.bus is None or self._transport is None:
            raise DriverFault(f"{self.protocol}: not open")
        return self.bus

    def _converter(self) -> Converter:
        if self.converter is None:
            raise DriverFault(f"{self.protocol}: not open (no calibration loaded)")
        return self.converter

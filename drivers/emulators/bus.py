"""An emulated servo bus on a pseudo-terminal.

The driver opens the pty's path with pyserial as it would a USB adapter. The emulator
reads instructions from the other side, lets its servos carry them out, and answers as a
half-duplex bus would in time: a reply starts when the request has been on the wire
(its bytes at the baud rate) and the servo's return delay has passed, one servo after
another; a broadcast write keeps the bus busy for its own wire time. `baud=0` answers at
once. Faults are injected per servo (drivers.emulators.faults).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
import tty
from collections.abc import Iterable, Sequence

from drivers.dynamixel import table as dxl_table
from drivers.emulators import dynamixel, feetech
from drivers.emulators.device import Device, Faults
from drivers.emulators.faults import Fault, parse_fault
from drivers.emulators.servo import EmulatedServo
from drivers.feetech import table as feetech_table
from drivers.servo.frames import Frame

PROTOCOLS = ("dynamixel", "feetech")
FEETECH_NUMBERS = {name: number for number, name in feetech_table.MODELS.items()}
DEFAULT_MODEL = {"dynamixel": dxl_table.MODEL_BY_NAME["xl330-m288"].number, "feetech": 777}


def model_number(protocol: str, model: str | int | None) -> int:
    """A model given by name (xl430-w250, sts3215) or number; the protocol's default."""
    if model is None:
        return DEFAULT_MODEL[protocol]
    if isinstance(model, int) or str(model).isdigit():
        return int(model)
    if protocol == "dynamixel" and model in dxl_table.MODEL_BY_NAME:
        return dxl_table.MODEL_BY_NAME[model].number
    if protocol == "feetech" and model in FEETECH_NUMBERS:
        return FEETECH_NUMBERS[str(model)]
    raise ValueError(f"unknown {protocol} model {model!r}")


class Emulator:
    """Servos `ids` of `protocol` on a pty; `port` is the path a driver opens."""

    def __init__(
        self,
        protocol: str,
        ids: Sequence[int] = (1, 2, 3, 4, 5, 6),
        *,
        baud: int = 1_000_000,
        model: str | int | Sequence[str | int] | None = None,
        faults: Iterable[Fault | str] = (),
    ) -> None:
        """`model`: every servo's, or one per ID in their order (an arm of mixed models);
        the protocol's default when None."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        if isinstance(model, list | tuple) and len(model) == 1:
            model = model[0]
        each = list(model) if isinstance(model, list | tuple) else [model] * len(ids)
        if len(each) != len(ids):
            raise ValueError(f"{len(each)} models for {len(ids)} ids: one per ID, or one for all")
        numbers = [model_number(protocol, m) for m in each]
        module = dynamixel if protocol == "dynamixel" else feetech
        now = time.monotonic()
        self.protocol = protocol
        self.baud = baud
        self.servos: dict[int, EmulatedServo] = {
            i: module.make_servo(i, n, now) for i, n in zip(ids, numbers, strict=True)
        }
        device_cls = dynamixel.DynamixelDevice if protocol == "dynamixel" else feetech.FeetechDevice
        self.device: Device = device_cls(self.servos)
        self.faults = Faults([f if isinstance(f, Fault) else parse_fault(f) for f in faults])
        self.lock = threading.Lock()  # held while servos and faults change
        self.master, self._slave = os.openpty()
        tty.setraw(self._slave)
        self.port = os.ttyname(self._slave)
        self._wake_r, self._wake_w = os.pipe()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._free_at = 0.0
        self.instructions = 0  # instruction packets handled
        # (packet ID, instruction) of each instruction handled, in order: what a client sent
        # (a test asserts a read-only client never wrote)
        self.received: list[tuple[int, int]] = []

    # ---- control -----------------------------------------------------------------------

    def start(self) -> Emulator:
        """Serve on a thread of this process (tests); `stop()` ends it."""
        self._thread = threading.Thread(target=self.serve, name="servo-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the pty (the driver's end then gets EIO); once only."""
        if self._stop.is_set():
            return
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        for fd in (self.master, self._slave, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def inject(self, fault: Fault | str) -> Fault:
        f = fault if isinstance(fault, Fault) else parse_fault(fault)
        with self.lock:
            self.faults.items.append(f)
        return f

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.items.clear()

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the loop ----------------------------------------------------------------------

    def serve(self) -> None:
        parser = self.device.parser()
        while not self._stop.is_set():
            ready, _, _ = select.select((self.master, self._wake_r), (), ())
            if self._wake_r in ready:
                return
            try:
                data = os.read(self.master, 4096)
            except OSError:
                return
            received = time.monotonic()
            for frame in parser.feed(data):
                if isinstance(frame, Frame):
                    self._answer(frame, received)

    def _wire(self, nbytes: int) -> float:
        return nbytes * 10.0 / self.baud if self.baud else 0.0

    def _answer(self, frame: Frame, received: float) -> None:
        with self.lock:
            self.device.tick(received)
            outs = self.device.handle(frame, received, self.faults)
            echo = self.faults.active(0, "echo")
            self.instructions += 1
            self.received.append((frame.ident, frame.head))
        at = max(received, self._free_at) + self._wire(len(frame.raw))
        if echo:
            self._send(frame.raw, at)
        for out in outs:
            at += out.delay_s + self._wire(len(out.data))
            self._send(out.data, at)
        self._free_at = at

    def _send(self, data: bytes, at: float) -> None:
        delay = at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.master, view)
            except OSError:
                return
            view = view[n:]

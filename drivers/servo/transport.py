"""The serial port under a servo bus: pyserial to open and configure, blocking reads with
a deadline (select on the descriptor: the thread sleeps until bytes arrive or time is up,
no polling loop), and the echo of our own packets discarded (half-duplex adapters that
loop TX back to RX)."""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Callable
from pathlib import Path

import serial

from drivers.servo.frames import Corrupt, Frame, FrameParser
from drivers.servo.latency import SYSFS_USB_SERIAL, check_latency_timer, set_low_latency

READ_CHUNK = 4096


class TransportError(OSError):
    """The port cannot be opened or has gone (unplugged)."""


class SerialTransport:
    """One serial port, one transaction at a time.

    `send(packet)` flushes stale input and writes the packet; `receive(parser, deadline_ns)`
    blocks until bytes arrive (or the deadline passes) and returns the frames they complete,
    minus an exact copy of the packet just sent (an echo), which is dropped and counted.
    """

    def __init__(
        self,
        port: str,
        baud: int,
        *,
        warn: Callable[[str], None] = lambda message: None,
        low_latency: bool = True,
        sysfs_root: Path = SYSFS_USB_SERIAL,
    ) -> None:
        self.port = port
        self.baud = baud
        self._warn = warn
        self._low_latency = low_latency
        self._sysfs = sysfs_root
        self._ser: serial.Serial | None = None
        self._fd = -1
        self._echo: bytes | None = None
        self.echoes = 0  # echoed packets discarded
        self.bytes_out = 0
        self.bytes_in = 0

    @property
    def is_open(self) -> bool:
        return self._ser is not None

    def open(self) -> None:
        """Open and configure the port; TransportError naming the port if it cannot."""
        try:
            ser = serial.Serial(self.port, self.baud, timeout=0, write_timeout=1.0, exclusive=True)
        except (serial.SerialException, OSError, ValueError) as exc:
            raise TransportError(f"cannot open {self.port}: {exc}") from None
        self._ser = ser
        self._fd = ser.fileno()
        for warning in (
            set_low_latency(ser) if self._low_latency else None,
            check_latency_timer(self.port, self._sysfs),
        ):
            if warning:
                self._warn(warning)
        ser.reset_input_buffer()

    def close(self) -> None:
        ser, self._ser, self._fd = self._ser, None, -1
        if ser is not None:
            with contextlib.suppress(serial.SerialException, OSError):
                ser.close()

    def wire_seconds(self, nbytes: int) -> float:
        """Time `nbytes` take on the wire (8N1: 10 bits a byte)."""
        return nbytes * 10.0 / self.baud

    def send(self, data: bytes) -> None:
        ser = self._require()
        try:
            ser.reset_input_buffer()  # a late reply to an earlier transaction is not this one's
            ser.write(data)
        except (serial.SerialException, OSError) as exc:
            raise TransportError(f"{self.port}: write failed: {exc}") from None
        self._echo = data
        self.bytes_out += len(data)

    def receive(self, parser: FrameParser, deadline_ns: int) -> list[Frame | Corrupt] | None:
        """The frames completed by the next bytes; [] when bytes came but completed nothing;
        None when the deadline passed with nothing read."""
        self._require()
        left = (deadline_ns - time.monotonic_ns()) / 1e9
        if left <= 0:
            return None
        try:
            ready, _, _ = select.select((self._fd,), (), (), left)
            if not ready:
                return None
            data = os.read(self._fd, READ_CHUNK)
        except InterruptedError:
            return []
        except OSError as exc:
            raise TransportError(f"{self.port}: read failed: {exc}") from None
        if not data:
            raise TransportError(f"{self.port}: the device has gone (end of file)")
        self.bytes_in += len(data)
        frames = parser.feed(data)
        if self._echo is not None and frames:
            for i, f in enumerate(frames):
                if isinstance(f, Frame) and f.raw == self._echo:
                    del frames[i]
                    self._echo = None
                    self.echoes += 1
                    break
        return frames

    def _require(self) -> serial.Serial:
        if self._ser is None:
            raise TransportError(f"{self.port}: not open")
        return self._ser

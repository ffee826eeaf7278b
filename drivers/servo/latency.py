"""USB-serial latency: the FTDI latency timer and the kernel's low-latency flag.

An FTDI adapter (U2D2, most Feetech boards' CH340/FTDI bridges) holds short replies for its
latency timer (16 ms by default) before passing them to the host: a 1 kHz bus becomes a
60 Hz one. The timer lives in sysfs, per device; 1 ms is what a servo bus wants.
"""

from __future__ import annotations

import os
from pathlib import Path

import serial

SYSFS_USB_SERIAL = Path("/sys/bus/usb-serial/devices")


def latency_timer_path(port: str, root: Path = SYSFS_USB_SERIAL) -> Path:
    """Where the latency timer of `port` (a /dev path, symlinks followed) would be."""
    return root / Path(os.path.realpath(port)).name / "latency_timer"


def check_latency_timer(
    port: str, root: Path = SYSFS_USB_SERIAL, *, fix: bool = True
) -> str | None:
    """A warning naming the fix when the port's latency timer is above 1 ms; None when it
    is 1 ms, or the port has none (not an FTDI-style adapter, a pty). With `fix`, tries to
    set it to 1 ms first (it can when run as root, or with a udev rule's group)."""
    path = latency_timer_path(port, root)
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    try:
        value = int(text)
    except ValueError:
        return f"{path}: unreadable latency timer {text[:20]!r}"
    if value <= 1:
        return None
    try:
        if not fix:
            raise PermissionError
        path.write_text("1\n")
        if int(path.read_text().strip()) <= 1:
            return None
    except (OSError, ValueError):
        pass
    return (
        f"{port}: the USB adapter's latency timer is {value} ms, so every reply waits up to "
        f"{value} ms; set it to 1 ms: `echo 1 | sudo tee {path}` (until unplugged), or "
        f'permanently with a udev rule: ATTR{{latency_timer}}="1" (docs/real-robots.md)'
    )


def set_low_latency(ser: serial.Serial) -> str | None:
    """Ask the kernel for low-latency mode (ASYNC_LOW_LATENCY); a warning when the device
    refuses (a pseudo-terminal, some drivers), never an error."""
    try:
        ser.set_low_latency_mode(True)
    except (ValueError, OSError, AttributeError, NotImplementedError) as exc:
        return f"{ser.port}: low-latency mode not available ({exc}); continuing without it"
    return None

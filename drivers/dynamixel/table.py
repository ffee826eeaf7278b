"""The X-series control table (XL330, XL430, XM430, XC430, XM540, XH430...), the models
robotd knows, and the Hardware Error Status bits."""

from __future__ import annotations

from dataclasses import dataclass

# EEPROM (written with torque off)
MODEL_NUMBER = 0  # 2
FIRMWARE_VERSION = 6  # 1
ID = 7  # 1
BAUD_RATE = 8  # 1
RETURN_DELAY_TIME = 9  # 1, units of 2 µs
DRIVE_MODE = 10  # 1, bit 0: reverse mode
OPERATING_MODE = 11  # 1: 3 position, 4 extended position, 5 current-based position
HOMING_OFFSET = 20  # 4, signed: Present Position = actual + offset
MAX_POSITION_LIMIT = 48  # 4
MIN_POSITION_LIMIT = 52  # 4
# RAM
TORQUE_ENABLE = 64  # 1
LED = 65  # 1
STATUS_RETURN_LEVEL = 68  # 1
HARDWARE_ERROR_STATUS = 70  # 1
BUS_WATCHDOG = 98  # 1, units of 20 ms; 0 off; 0xFF (-1) once it has tripped
GOAL_CURRENT = 102  # 2
GOAL_VELOCITY = 104  # 4
PROFILE_ACCELERATION = 108  # 4
PROFILE_VELOCITY = 112  # 4
GOAL_POSITION = 116  # 4, signed
MOVING = 122  # 1
PRESENT_CURRENT = 126  # 2, signed (Present Load on XL430)
PRESENT_VELOCITY = 128  # 4, signed, 0.229 rev/min
PRESENT_POSITION = 132  # 4, signed
PRESENT_TEMPERATURE = 146  # 1

# One sync read per tick: current, velocity, position are contiguous.
STATE_BLOCK = (PRESENT_CURRENT, 10)
RESOLUTION = 4096
VELOCITY_UNIT_RAD_S = 0.229 * 2 * 3.141592653589793 / 60.0
WATCHDOG_UNIT_MS = 20
# Baud Rate (8) holds a code, the rate it stands for fixed by the control table (ROBOTIS
# e-Manual, X series). 7 (4.5 Mbps) is not an XL330's or XC330's: their table stops at 6.
BAUD_RATES = {
    0: 9_600,
    1: 57_600,
    2: 115_200,
    3: 1_000_000,
    4: 2_000_000,
    5: 3_000_000,
    6: 4_000_000,
    7: 4_500_000,
}

HARDWARE_ERRORS = {
    0x01: "input voltage",
    0x04: "overheating",
    0x08: "motor encoder",
    0x10: "electrical shock",
    0x20: "overload",
}


@dataclass(frozen=True)
class Model:
    name: str
    number: int
    effort_unit: float  # Present Current/Load raw → A (current), or → fraction (load)
    effort: str  # "current" | "load"
    fast_sync_read: bool  # FAST_SYNC_READ (0x8A) on firmware 45 and later


MODELS = {
    m.number: m
    for m in (
        Model("xl330-m077", 1190, 0.001, "current", True),
        Model("xl330-m288", 1200, 0.001, "current", True),
        Model("xc330-m181", 1230, 0.001, "current", True),
        Model("xc330-m288", 1240, 0.001, "current", True),
        Model("xl430-w250", 1060, 0.001, "load", True),
        Model("2xl430-w250", 1090, 0.001, "load", True),
        Model("xc430-w150", 1070, 0.00269, "current", True),
        Model("xm430-w210", 1030, 0.00269, "current", True),
        Model("xm430-w350", 1020, 0.00269, "current", True),
        Model("xh430-w350", 1010, 0.00269, "current", True),
        Model("xm540-w270", 1120, 0.00269, "current", True),
    )
}
MODEL_BY_NAME = {m.name: m for m in MODELS.values()}
MODEL_NAMES = {m.number: m.name for m in MODELS.values()}  # model number → name
FAST_SYNC_READ_FIRMWARE = 45


def hardware_error_names(value: int) -> list[str]:
    """Hardware Error Status (70) in words; unknown bits named by number."""
    names = [name for bit, name in HARDWARE_ERRORS.items() if value & bit]
    names += [f"bit {b}" for b in range(8) if value & (1 << b) and (1 << b) not in HARDWARE_ERRORS]
    return names

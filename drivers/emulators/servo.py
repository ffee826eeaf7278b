"""An emulated servo: a control table, a shaft that moves toward its goal while torque is
on, and the family's register semantics (subclasses in dynamixel.py and feetech.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod

TABLE_SIZE = 256
SPEED_TICKS_S = 1500.0  # how fast the shaft follows its goal (about 2.3 rad/s)


class EmulatedServo(ABC):
    """One servo. `actual` is the shaft's encoder position (ticks, before the homing offset);
    what the servo reports and takes as goal is in its own frame (family semantics)."""

    torque_address: int
    goal_address: int
    return_delay_address: int

    def __init__(self, ident: int, model: int, now: float) -> None:
        self.ident = ident
        self.model = model
        self.table = bytearray(TABLE_SIZE)
        self.actual = 2048.0
        self.velocity = 0.0  # ticks/s
        self.target = self.actual  # the goal, as a shaft position
        self.last = now
        self.forced: dict[int, bytes] = {}  # register → bytes a fault makes it read
        self.defaults()
        self.refresh(now)

    # ---- family semantics --------------------------------------------------------------

    @abstractmethod
    def defaults(self) -> None:
        """Factory values of the control table."""

    @abstractmethod
    def present(self) -> float:
        """The reported position for the shaft's `actual`."""

    @abstractmethod
    def shaft(self, present: float) -> float:
        """The shaft position a reported (goal) position means."""

    @abstractmethod
    def goal(self) -> int:
        """The Goal Position register's value."""

    @abstractmethod
    def store_present(self) -> None:
        """Write present position/velocity/effort into the table."""

    def writable(self, address: int, length: int) -> bool:
        """Whether a write may change these registers now (EEPROM locks)."""
        return True

    def written(self, address: int, length: int, now: float) -> None:
        """React to a write that changed [address, address + length)."""
        if address <= self.goal_address < address + length:
            self.target = self.shaft(self.goal())

    # ---- behaviour ---------------------------------------------------------------------

    @property
    def torque(self) -> bool:
        return bool(self.table[self.torque_address])

    @property
    def return_delay_s(self) -> float:
        return self.table[self.return_delay_address] * 2e-6

    def advance(self, now: float) -> None:
        """Move the shaft toward its goal for the time since the last update."""
        dt = max(0.0, now - self.last)
        self.last = now
        if not dt:
            return
        if self.torque:
            step = max(-SPEED_TICKS_S * dt, min(SPEED_TICKS_S * dt, self.target - self.actual))
            self.actual += step
            self.velocity = step / dt
        else:
            self.velocity = 0.0

    def refresh(self, now: float) -> None:
        self.advance(now)
        self.store_present()
        for address, value in self.forced.items():
            self.table[address : address + len(value)] = value

    def read(self, address: int, length: int, now: float) -> bytes | None:
        """Registers [address, address + length), or None when out of the table."""
        if address < 0 or length < 1 or address + length > TABLE_SIZE:
            return None
        self.refresh(now)
        return bytes(self.table[address : address + length])

    def write(self, address: int, data: bytes, now: float) -> bool:
        """Store registers; False when out of the table or not writable now."""
        if address < 0 or not data or address + len(data) > TABLE_SIZE:
            return False
        if not self.writable(address, len(data)):
            return False
        self.advance(now)
        self.table[address : address + len(data)] = data
        self.written(address, len(data), now)
        return True

    def put(self, address: int, value: int, size: int, signed: bool = False) -> None:
        self.table[address : address + size] = value.to_bytes(size, "little", signed=signed)

    def get(self, address: int, size: int, signed: bool = False) -> int:
        return int.from_bytes(self.table[address : address + size], "little", signed=signed)

    def hold_here(self) -> None:
        """Goal := present (what a servo does when its watchdog stops it)."""
        self.target = self.actual

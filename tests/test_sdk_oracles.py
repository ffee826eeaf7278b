"""The vendors' SDKs from PyPI as oracles (test dependencies only).

1. The same packet built by the SDK and by robotd is the same bytes: the SDK writes to a
   real pty and the test reads the far side. Only payloads without FF FF FD: the Dynamixel
   SDK's own transmit stuffing is known to be wrong there.
2. The SDK as a client of robotd's emulator reads the same values robotd's driver reads.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drivers.dynamixel import packet as dxp
from drivers.emulators.launch import start_emulator
from drivers.feetech import packet as ftp
from tests.servo_util import IDS, NAMES, RawPty, make_driver, write_calibration

dxl = pytest.importorskip("dynamixel_sdk")
scs = pytest.importorskip("scservo_sdk")

ONE_CALL = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def dxl_pty():
    pty = RawPty()
    port = dxl.PortHandler(pty.path)
    assert port.openPort() and port.setBaudRate(1_000_000)
    yield pty, port, dxl.PacketHandler(2.0)
    port.closePort()
    pty.close()


@pytest.fixture(scope="module")
def scs_pty():
    pty = RawPty()
    port = scs.PortHandler(pty.path)
    assert port.openPort() and port.setBaudRate(1_000_000)
    yield pty, port, scs.PacketHandler(0)
    port.closePort()
    pty.close()


def _no_stuffing(*chunks: bytes) -> bool:
    return all(b"\xff\xff\xfd" not in c for c in chunks)


ids = st.lists(st.integers(0, 252), min_size=1, max_size=8, unique=True)
goals = st.integers(-(2**31), 2**31 - 1)


@ONE_CALL
@given(ident=st.integers(0, 252), address=st.integers(0, 700), value=goals)
def test_dynamixel_write_and_read_bytes_match_the_sdk(dxl_pty, ident, address, value):
    pty, port, ph = dxl_pty
    data = value.to_bytes(4, "little", signed=True)
    ours = dxp.write(ident, address, data)
    if not _no_stuffing(ours[7:]):
        return
    ph.writeTxOnly(port, ident, address, 4, list(data))
    assert pty.take(len(ours)) == ours
    ours = dxp.read(ident, address, 4)
    if _no_stuffing(ours[7:]):
        ph.readTx(port, ident, address, 4)
        port.is_using = False  # readTx leaves the port claimed for its readRx
        assert pty.take(len(ours)) == ours


@ONE_CALL
@given(servos=ids, values=st.lists(goals, min_size=8, max_size=8))
def test_dynamixel_sync_read_and_write_bytes_match_the_sdk(dxl_pty, servos, values):
    pty, port, ph = dxl_pty
    reader = dxl.GroupSyncRead(port, ph, 126, 10)
    for i in servos:
        reader.addParam(i)
    ours = dxp.sync_read(126, 10, servos)
    if _no_stuffing(ours[7:]):
        reader.txPacket()
        port.is_using = False
        assert pty.take(len(ours)) == ours
    writer = dxl.GroupSyncWrite(port, ph, 116, 4)
    items = [(i, v.to_bytes(4, "little", signed=True)) for i, v in zip(servos, values)]
    for i, data in items:
        writer.addParam(i, list(data))
    ours = dxp.sync_write(116, 4, items)
    if _no_stuffing(ours[7:]):
        writer.txPacket()
        assert pty.take(len(ours)) == ours


@ONE_CALL
@given(ident=st.integers(0, 252), address=st.integers(0, 255), value=st.integers(0, 0xFFFF))
def test_feetech_write_and_read_bytes_match_the_sdk(scs_pty, ident, address, value):
    pty, port, ph = scs_pty
    data = value.to_bytes(2, "little")
    ph.writeTxOnly(port, ident, address, 2, list(data))
    ours = ftp.write(ident, address, data)
    assert pty.take(len(ours)) == ours
    if ident < ftp.BROADCAST:
        ph.readTx(port, ident, address, 2)
        port.is_using = False
        ours = ftp.read(ident, address, 2)
        assert pty.take(len(ours)) == ours


@ONE_CALL
@given(servos=ids, values=st.lists(st.integers(0, 0xFFFF), min_size=8, max_size=8))
def test_feetech_sync_read_and_write_bytes_match_the_sdk(scs_pty, servos, values):
    pty, port, ph = scs_pty
    reader = scs.GroupSyncRead(port, ph, 56, 6)
    for i in servos:
        reader.addParam(i)
    reader.txPacket()
    port.is_using = False
    ours = ftp.sync_read(56, 6, servos)
    assert pty.take(len(ours)) == ours
    writer = scs.GroupSyncWrite(port, ph, 42, 2)
    items = [(i, v.to_bytes(2, "little")) for i, v in zip(servos, values)]
    for i, data in items:
        writer.addParam(i, list(data))
    writer.txPacket()
    ours = ftp.sync_write(42, 2, items)
    assert pty.take(len(ours)) == ours


# ---- the SDK as a client of the emulator ---------------------------------------------------

GOALS = [1500, 1800, 2048, 2300, 2600, 2900]


def _dxl_sdk_move_and_read(port_path: str) -> tuple[list[int], list[int]]:
    port = dxl.PortHandler(port_path)
    ph = dxl.PacketHandler(2.0)
    assert port.openPort() and port.setBaudRate(1_000_000)
    try:
        for i, goal in zip(IDS, GOALS):
            assert ph.write1ByteTxRx(port, i, 64, 1)[0] == dxl.COMM_SUCCESS
            assert ph.write4ByteTxRx(port, i, 116, goal)[0] == dxl.COMM_SUCCESS
        reader = dxl.GroupSyncRead(port, ph, 132, 4)
        for i in IDS:
            reader.addParam(i)
        deadline = time.monotonic() + 10  # the shafts move at ~1500 ticks/s: under 1 s
        while time.monotonic() < deadline:
            assert reader.txRxPacket() == dxl.COMM_SUCCESS
            slow = [reader.getData(i, 132, 4) for i in IDS]
            if slow == GOALS:
                break
        assert reader.fastSyncRead() == dxl.COMM_SUCCESS
        fast = [reader.getData(i, 132, 4) for i in IDS]
        for i in IDS:
            ph.write1ByteTxRx(port, i, 64, 0)
        return slow, fast
    finally:
        port.closePort()


def _scs_sdk_move_and_read(port_path: str) -> list[int]:
    port = scs.PortHandler(port_path)
    ph = scs.PacketHandler(0)
    assert port.openPort() and port.setBaudRate(1_000_000)
    try:
        for i, goal in zip(IDS, GOALS):
            assert ph.write1ByteTxRx(port, i, 40, 1)[0] == scs.COMM_SUCCESS
            assert ph.write2ByteTxRx(port, i, 42, goal)[0] == scs.COMM_SUCCESS
        reader = scs.GroupSyncRead(port, ph, 56, 2)
        for i in IDS:
            reader.addParam(i)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert reader.txRxPacket() == scs.COMM_SUCCESS
            seen = [reader.getData(i, 56, 2) for i in IDS]
            if seen == GOALS:
                break
        for i in IDS:
            ph.write1ByteTxRx(port, i, 40, 0)
        return seen
    finally:
        port.closePort()


@pytest.mark.parametrize("protocol", ["dynamixel", "feetech"])
def test_the_sdk_reads_from_the_emulator_what_the_driver_reads(protocol, tmp_path):
    cal = write_calibration(tmp_path / "cal.json", protocol, half_range=2000)
    with start_emulator(protocol, IDS) as emu:
        if protocol == "dynamixel":
            slow, fast = _dxl_sdk_move_and_read(emu.port)
            assert slow == fast == GOALS
            sdk = slow
        else:
            sdk = _scs_sdk_move_and_read(emu.port)
            assert sdk == GOALS
        driver = make_driver(protocol, emu.port, cal)
        driver.open()
        try:
            state = driver.read()
        finally:
            driver.close()
    ticks = driver.converter.to_ticks(state.position)  # back to ticks, exactly
    assert list(ticks) == sdk
    assert state.position[2] == 0.0 and state.position[0] < 0 < state.position[4]
    assert 0.0 < state.position[5] < 1.0  # the gripper reads 0..1
    assert driver.names == NAMES

"""Protocol 2.0 packets: the e-manual's examples byte for byte, byte stuffing, the
streaming parser on hostile input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drivers.dynamixel import packet as p
from drivers.servo.frames import Corrupt, Frame

H = bytes.fromhex


# (what, built by robotd, the e-manual's bytes) — ROBOTIS e-manual, Protocol 2.0
EMANUAL = [
    ("ping id 1", lambda: p.ping(1), "FF FF FD 00 01 03 00 01 19 4E"),
    ("ping broadcast", lambda: p.ping(0xFE), "FF FF FD 00 FE 03 00 01 31 42"),
    (
        "ping status id 1",
        lambda: p.status_packet(1, 0, H("06 04 26")),
        "FF FF FD 00 01 07 00 55 00 06 04 26 65 5D",
    ),
    (
        "ping status id 2",
        lambda: p.status_packet(2, 0, H("06 04 26")),
        "FF FF FD 00 02 07 00 55 00 06 04 26 6F 6D",
    ),
    (
        "read present position",
        lambda: p.read(1, 132, 4),
        "FF FF FD 00 01 07 00 02 84 00 04 00 1D 15",
    ),
    (
        "read status 166",
        lambda: p.status_packet(1, 0, (166).to_bytes(4, "little")),
        "FF FF FD 00 01 08 00 55 00 A6 00 00 00 8C C0",
    ),
    (
        "write goal 512",
        lambda: p.write(1, 116, (512).to_bytes(4, "little")),
        "FF FF FD 00 01 09 00 03 74 00 00 02 00 00 CA 89",
    ),
    ("write status", lambda: p.status_packet(1, 0), "FF FF FD 00 01 04 00 55 00 A1 0C"),
    ("reboot", lambda: p.packet(1, p.REBOOT), "FF FF FD 00 01 03 00 08 2F 4E"),
    (
        "clear",
        lambda: p.packet(1, 0x10, H("01 44 58 4C 22")),
        "FF FF FD 00 01 08 00 10 01 44 58 4C 22 B1 DC",
    ),
    (
        "sync read 1,2",
        lambda: p.sync_read(132, 4, [1, 2]),
        "FF FF FD 00 FE 09 00 82 84 00 04 00 01 02 CE FA",
    ),
    (
        "sync read status 2079",
        lambda: p.status_packet(2, 0, (2079).to_bytes(4, "little")),
        "FF FF FD 00 02 08 00 55 00 1F 08 00 00 BA BE",
    ),
    (
        "sync write 150, 170",
        lambda: p.sync_write(
            116, 4, [(1, (150).to_bytes(4, "little")), (2, (170).to_bytes(4, "little"))]
        ),
        "FF FF FD 00 FE 11 00 83 74 00 04 00 01 96 00 00 00 02 AA 00 00 00 82 87",
    ),
    (
        "bulk read",
        lambda: p.packet(0xFE, 0x92, H("01 90 00 02 00 02 92 00 01 00")),
        "FF FF FD 00 FE 0D 00 92 01 90 00 02 00 02 92 00 01 00 1A 05",
    ),
]


@pytest.mark.parametrize(("what", "build", "manual"), EMANUAL, ids=[e[0] for e in EMANUAL])
def test_emanual_examples_byte_for_byte(what, build, manual):
    assert build() == H(manual)


@pytest.mark.parametrize(("what", "build", "manual"), EMANUAL, ids=[e[0] for e in EMANUAL])
def test_parser_reads_the_emanual_packets(what, build, manual):
    raw = H(manual)
    (frame,) = p.PacketParser().feed(raw)
    assert isinstance(frame, Frame)
    assert frame.ident == raw[4] and frame.head == raw[7] and frame.raw == raw


def test_stuffing_changes_length_and_crc_over_the_stuffed_bytes():
    params = H("FF FF FD 01")
    pkt = p.packet(1, p.WRITE, params)
    body = pkt[7:-2]
    assert body == H("03 FF FF FD FD 01")  # INST then the stuffed params
    assert pkt[5] | pkt[6] << 8 == len(body) + 2
    assert p.crc16(pkt[:-2]) == pkt[-2] | pkt[-1] << 8
    (frame,) = p.PacketParser().feed(pkt)
    assert frame.params == params  # unstuffed after the CRC check


@given(st.binary(max_size=300))
def test_stuffing_round_trip(data):
    stuffed = p.stuff(data)
    assert p.unstuff(stuffed) == data
    # every FF FF FD in the stuffed stream is followed by its FD
    i = stuffed.find(b"\xff\xff\xfd")
    while i >= 0:
        assert stuffed[i + 3 : i + 4] == b"\xfd"
        i = stuffed.find(b"\xff\xff\xfd", i + 4)


@given(st.integers(0, 252), st.binary(max_size=200), st.integers(1, 17))
def test_any_payload_survives_packet_and_parser_in_any_chunking(ident, params, chunk):
    pkt = p.status_packet(ident, 0, params)
    parser = p.PacketParser()
    frames = []
    for i in range(0, len(pkt), chunk):
        frames += parser.feed(pkt[i : i + chunk])
    assert frames == [Frame(ident, p.STATUS, b"\x00" + params, pkt)]


def test_unstuff_refuses_a_missing_stuffed_byte():
    assert p.unstuff(H("FF FF FD 01")) is None
    bad = bytearray(p.packet(1, p.STATUS, H("00 FF FF FD 01")))
    # rebuild the packet with its stuffing byte removed and a CRC that matches
    body = H("55 00 FF FF FD 01")
    head = p.HEADER + bytes((1, len(body) + 2, 0)) + body
    raw = head + p.crc16(head).to_bytes(2, "little")
    assert bad != raw
    (out,) = p.PacketParser().feed(raw)
    assert isinstance(out, Corrupt) and "stuffing" in out.reason


def test_parser_resyncs_after_garbage_and_a_bad_crc():
    good1 = p.status_packet(1, 0, b"\x01\x02")
    good2 = p.status_packet(2, 0, b"\x03")
    bad = bytearray(p.status_packet(3, 0, b"\x09"))
    bad[-1] ^= 0xFF
    stream = b"\x00\xff\x13" + good1 + bytes(bad) + b"\xff\xff\xfd" + good2
    out = p.PacketParser().feed(stream)
    frames = [f for f in out if isinstance(f, Frame)]
    assert [f.ident for f in frames] == [1, 2]
    assert any(isinstance(f, Corrupt) and f.ident == 3 for f in out)


def test_parser_refuses_out_of_bounds_lengths_without_waiting_for_them():
    parser = p.PacketParser()
    huge = p.HEADER + bytes((1, 0xFF, 0xFF)) + b"\x55"
    out = parser.feed(huge + p.status_packet(4, 0))
    assert isinstance(out[0], Corrupt) and "length" in out[0].reason
    assert [f.ident for f in out if isinstance(f, Frame)] == [4]


@given(st.binary(max_size=600))
def test_parser_never_raises_on_noise(noise):
    parser = p.PacketParser()
    out = parser.feed(noise) + parser.feed(p.status_packet(7, 0, b"\x42"))
    assert all(isinstance(f, Frame | Corrupt) for f in out)
    # a partial header in the noise may claim a long packet; a transaction starts afresh
    parser.reset()
    assert parser.feed(p.status_packet(7, 0, b"\x42"))[0].ident == 7


def test_fast_sync_read_reply_round_trip():
    entries = [(0, 3, (100).to_bytes(4, "little")), (0x80, 7, (200).to_bytes(4, "little"))]
    raw = p.fast_status_packet(entries)
    (frame,) = p.PacketParser().feed(raw)
    assert frame.ident == p.BROADCAST and frame.head == p.STATUS
    assert p.split_fast_status(frame.params, 4) == entries
